"""``workload.sampling``: how every request samples its tokens, in vLLM's ``SamplingParams`` names.

Absent, the requests sample as the serving benchmarks' clients send them: ``vllm bench serve`` (and
benchmark_serving.py before it) sets ``temperature`` 0.0 unless told otherwise ("Default to greedy decoding"), and
the offline ``LLM`` class's ``SamplingParams()`` samples at temperature 1.0 with top-p 1.0 and no top-k: neither
filters the vocabulary, so neither pays the sampler's sort (sim/engines/costs.py, ``SAMPLER_SORT_TIME``).
"""

from __future__ import annotations

from pydantic import Field

from sim.config.input_model import Float, FrozenInputModel, Int

# vLLM's _SAMPLING_EPS (vllm/sampling_params.py): a temperature below it is greedy (argmax, no filter)
GREEDY_TEMPERATURE = 1e-5


class Sampling(FrozenInputModel):
    """The sampling parameters every request is sent with (vLLM's defaults where a key is left out)."""

    temperature: Float = Field(default=1.0, ge=0, le=1000, description="0 (below 1e-5): greedy, no filter.")
    top_p: Float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling: below 1 vLLM filters the "
                         "vocabulary to the smallest set holding top_p of the probability.")
    top_k: Int = Field(default=0, ge=-1, description="Only the top_k most likely tokens; 0 or -1: off.")
    repetition_penalty: Float = Field(default=1.0, gt=0, le=1000, description="Above 1 discourages tokens already "
                                      "in the prompt or the output; 1: off.")
    presence_penalty: Float = Field(default=0.0, ge=-2, le=2, description="Subtracted from a token's logit once "
                                    "it has appeared in the output; 0: off.")
    frequency_penalty: Float = Field(default=0.0, ge=-2, le=2, description="Subtracted from a token's logit per "
                                     "time it has appeared in the output; 0: off.")

    def sorts_vocabulary(self) -> bool:
        """Whether vLLM's PyTorch sampler sorts each row's whole vocabulary: top-p below 1 on a sampled (not
        greedy) request. Top-k alone takes torch.topk, no full sort (vllm/v1/sample/ops/topk_topp_sampler.py
        ``apply_top_k_only``, since vLLM PR #15478)."""
        return self.temperature >= GREEDY_TEMPERATURE and self.top_p < 1.0

    def penalizes(self) -> bool:
        """Whether vLLM applies its penalties (any of the three off its neutral value): V1 then builds each row's
        output tokens into a tensor on the host every step (sim/engines/sampling.py, ``PENALTY_HOST_TIME``)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def describe_penalties(self) -> str:
        """The penalties off their neutral values, as a scenario spells them ("repetition_penalty 1.1")."""
        neutral = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
        return ", ".join(f"{k} {getattr(self, k):g}" for k, v in neutral.items() if getattr(self, k) != v)

    def describe(self) -> str:
        pen = (f", repetition_penalty {self.repetition_penalty:g}, presence_penalty {self.presence_penalty:g}, "
               f"frequency_penalty {self.frequency_penalty:g}") if self.penalizes() else ""
        return f"sampling temperature {self.temperature:g}, top_p {self.top_p:g}, top_k {self.top_k}{pen}"
