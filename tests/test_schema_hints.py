"""An unknown key names the key the user most likely meant, in the one error line that names the key."""

from __future__ import annotations

import copy

import pytest
from pydantic import BaseModel

from sim.config.scenario import parse_scenario
from sim.config.scenario_messages import closest_key, closest_keys, either, unknown_key_hint
from sim.config.schema import ScenarioError

BASE = {
    "name": "hints",
    "workload": {"num_requests": 10, "arrival": {"type": "poisson", "rate": 1.0},
                 "prompt_len": {"type": "fixed", "value": 8}, "output_len": {"type": "fixed", "value": 4}},
    "deployment": {"model": "tiny", "gpu": "h100-sxm"},
    "variants": [{"name": "a", "policy": {"type": "continuous"}}],
}


def _error(change) -> str:
    raw = copy.deepcopy(BASE)
    change(raw)
    with pytest.raises(ScenarioError) as e:
        parse_scenario(raw, source="s.yaml")
    return str(e.value)


@pytest.mark.parametrize(
    "change, line",
    [
        (lambda r: r["deployment"].update(tp=2),
         "s.yaml: deployment.tp: unknown key; did you mean tensor_parallel_size?"),
        (lambda r: r["deployment"].update(gpu_mem_util=0.5),
         "s.yaml: deployment.gpu_mem_util: unknown key; did you mean gpu_memory_utilization?"),
        (lambda r: r["variants"][0]["policy"].update(max_num_seq=4),
         "s.yaml: variants.0.policy.max_num_seq: unknown key; did you mean max_num_seqs?"),
        # a key that belongs to another section says which
        (lambda r: r["variants"][0].update(tp=2),
         "s.yaml: variants.0.tp: unknown key; did you mean tensor_parallel_size (a key of deployment)?"),
        # a variant's deployment keys are checked against the deployment schema
        (lambda r: r["variants"][0].update(deployment={"blocksize": 8}),
         "s.yaml: variants.0.deployment.blocksize: unknown key; did you mean block_size?"),
        # a user's class: its own parameter written beside cls, where its constructor never sees it
        (lambda r: r["variants"][0].update(policy={"type": "custom", "cls": "sim.policies.queue:FCFSPolicy",
                                                   "short": 256}),
         "s.yaml: variants.0.policy.short: unknown key; your class's constructor arguments go under args: "
         "{args: {short: ...}}"),
        # vllm bench's option names, which no spelling rule leads to servesim's (they got no hint)
        (lambda r: r["workload"].update(arrival={"type": "closed_loop", "concurrency": 8}),
         "s.yaml: workload.arrival.concurrency: unknown key; did you mean num_users (vllm bench's "
         "--max-concurrency)?"),
        (lambda r: r["workload"].update(max_concurrency=8),
         "s.yaml: workload.max_concurrency: unknown key; did you mean num_users (vllm bench's --max-concurrency; "
         "a key of workload.arrival)?"),
        (lambda r: r["workload"].update(num_prompts=8),
         "s.yaml: workload.num_prompts: unknown key; did you mean num_requests (vllm bench's --num-prompts)?"),
        # --burstiness is the gaps' gamma shape, where servesim's gamma takes their cv (it was told nothing)
        (lambda r: r["workload"].update(arrival={"type": "gamma", "rate": 2.0, "burstiness": 0.5}),
         "s.yaml: workload.arrival.burstiness: unknown key; did you mean cv (vllm bench's --burstiness B, the gaps' "
         "gamma shape: cv = 1/sqrt(B))?"),
        # vLLM's engine arguments: --dtype is the weights' (it was told kv_dtype, the KV cache's), --kv-cache-dtype
        (lambda r: r["deployment"].update(dtype="bfloat16"),
         "s.yaml: deployment.dtype: unknown key; did you mean weight_dtype (vLLM's --dtype)?"),
        (lambda r: r["deployment"].update(kv_cache_dtype="fp8"),
         "s.yaml: deployment.kv_cache_dtype: unknown key; did you mean kv_dtype (vLLM's --kv-cache-dtype)?"),
        (lambda r: r["deployment"].update(quantization="fp8"),
         "s.yaml: deployment.quantization: unknown key; did you mean weight_dtype (vLLM's --quantization)?"),
        # nothing close: no guess
        (lambda r: r["deployment"].update(colour="red"), "s.yaml: deployment.colour: unknown key"),
    ],
)
def test_unknown_key_names_the_closest(change, line):
    assert line in _error(change).splitlines()


def test_closest_key_rules():
    known = ["tensor_parallel_size", "tensor_parallel_sizes", "max_num_seqs", "max_num_batched_tokens", "block_size"]
    assert closest_key("tp", known) == "tensor_parallel_size"  # initials; the shorter of two
    assert closest_key("mnbt", known) == "max_num_batched_tokens"
    assert closest_key("max_num_seq", known) == "max_num_seqs"  # spelling
    assert closest_key("Block_Size", known) == "block_size"  # case
    assert closest_key("m", known) is None  # one letter says too little
    assert closest_key("zzz", known) is None


@pytest.mark.parametrize("router, line", [
    ({"type": "custom", "cls": "sim.policies.queue:FCFSPolicy", "args": {"x": 1}},
     "s.yaml: variants.0.cluster.router.custom: cls sim.policies.queue:FCFSPolicy: constructing it with args "
     "{'x': 1} raised TypeError: QueuePolicy.__init__() got an unexpected keyword argument 'x' (FCFSPolicy's "
     "constructor takes enable_chunked_prefill, preemption_mode)"),
    ({"type": "power_of_tw"}, "s.yaml: variants.0.cluster.router.type: unknown type power_of_tw; did you mean "
     "power_of_two? expected one of 'custom', 'power_of_two', 'cache_load_score', 'slo_aware'"),
    ({"type": "power_of_two", "sed": 1}, "s.yaml: variants.0.cluster.router.sed: unknown key; did you mean seed?"),
])
def test_a_router_mapping_with_a_mistake_is_named_alone(router, line):
    """A router written as a mapping, with a mistake inside: the message led with the name form's complaint,
    "cluster.router: must be 'round_robin', 'least_outstanding', 'least_kv' or 'prefix_affinity'", and named the
    real problem on a second line."""
    assert _error(lambda r: r["variants"][0].update(cluster={"replicas": 2, "router": router})) == line


@pytest.mark.parametrize("where, written, meant", [
    (("variants", 0, "policy"), "continous", "continuous"), (("workload", "arrival"), "Poisson", "poisson"),
    (("workload", "prompt_len"), "lognorm", "lognormal"), (("workload", "arrival"), "bursty", None)])
def test_a_misspelt_type_names_the_closest(where, written, meant):
    """An unknown ``type:`` listed every kind but named none ('unknown type continous; expected one of 'static',
    'continuous', ...'), where a misspelt key gets 'did you mean'; now the closest kind is named first."""
    def change(raw):
        section = raw
        for part in where:
            section = section[part]
        section["type"] = written

    msg = _error(change)
    hint = f"did you mean {meant}? " if meant else ""
    assert f".type: unknown type {written}; {hint}expected one of '" in msg, msg


@pytest.mark.parametrize("written, meant", [("round_robn", "round_robin"), ("least-kv", "least_kv"),
                                             ("power_of_2", "power_of_two"), ("fastest", None)])
def test_a_router_name_misspelt_lists_every_built_in(written, meant):
    """A misspelt router name was answered with the four names a string took before routers could be named either
    way ("must be 'round_robin', 'least_outstanding', 'least_kv' or 'prefix_affinity'; or expected a mapping of
    keys to values"), as if power_of_two, cache_load_score and slo_aware, which the same string now names, did not
    exist; and 'least-kv' got no hint. One line now names them all, and the closest."""
    hint = f"did you mean {meant}? " if meant else ""
    assert _error(lambda r: r["variants"][0].update(cluster={"replicas": 2, "router": written})) == (
        f"s.yaml: variants.0.cluster.router: not a router's name; {hint}the built-ins: round_robin, "
        "least_outstanding, least_kv, prefix_affinity, power_of_two, cache_load_score, slo_aware; or {type: custom, "
        f"cls: 'file.py:Class'}} for a servesim.Router of your own (got '{written}')")


@pytest.mark.parametrize("name", ["a\nb", "   ", "tab\there"])
def test_a_variant_name_that_cannot_head_a_column_is_refused(name: str) -> None:
    # "a\nb" broke the printed table's header over two lines; "   " headed a blank column
    msg = _error(lambda raw: raw["variants"][0].update(name=name))
    assert "variants.0.name" in msg and "line break, tab or other control character" in msg or \
        "variants.0.name" in msg and "only spaces" in msg, msg


def test_a_variant_name_of_other_characters_is_kept() -> None:
    raw = copy.deepcopy(BASE)
    raw["variants"][0]["name"] = 'a<b>&"c\',d{x}=1 \\ ünï 名'
    assert parse_scenario(raw, source="s.yaml").variants[0].name == raw["variants"][0]["name"]


@pytest.mark.parametrize("name", ["tp\u00a02", "\U0001f469\u200d\U0001f4bb coder", "\u00a0x\u3000"])
def test_a_variant_name_with_a_no_break_space_or_a_joiner_is_kept(name: str) -> None:
    # printable in a table, though str.isprintable() says not: a no-break space pasted from a document, an
    # ideographic space, an emoji's zero-width joiner
    raw = copy.deepcopy(BASE)
    raw["variants"][0]["name"] = name
    assert parse_scenario(raw, source="s.yaml").variants[0].name == name


@pytest.mark.parametrize("name", ["a\u2028b", "a\u2029b", "a\rb", "a\x1bb"])
def test_a_variant_name_with_a_line_separator_or_escape_is_refused(name: str) -> None:
    msg = _error(lambda raw: raw["variants"][0].update(name=name))
    assert "variants.0.name" in msg and "line break, tab or other control character" in msg, msg


@pytest.mark.parametrize(("key", "line"), [
    ("deployment.max_num_seqs", "deployment.max_num_seqs: unknown key; did you mean policy.max_num_seqs?"),
    ("deployment.enable_chunked_prefill", "unknown key; did you mean policy.enable_chunked_prefill?"),
    ("policy.gpu", "policy.gpu: unknown key; did you mean deployment.gpu?"),
    ("deployment.seed", "deployment.seed: unknown key; did you mean seed?"),
    ("variants.0.deployment.max_num_seqs", "unknown key; did you mean variants.0.policy.max_num_seqs?"),
    ("deployment.zzz", "deployment.zzz: unknown key; known keys: block_size, "),  # in no section: the section's
    ("variants.0.seed", "variants.0.seed: unknown key; known keys: admission, "),  # not a predictor's, 3 deep
    # the rules a file's key gets (initials, vllm bench's names, the closest key elsewhere): --set deployment.tp
    # was told the deployment's eighteen keys, kv_cache.blocksize the KV cache's four, workload.num_prompts the
    # workload's nine, where the file's very keys got "did you mean"
    ("deployment.tp", "deployment.tp: unknown key; did you mean deployment.tensor_parallel_size?"),
    ("kv_cache.blocksize", "kv_cache.blocksize: unknown key; did you mean deployment.block_size?"),
    ("workload.num_prompts",
     "workload.num_prompts: unknown key; did you mean workload.num_requests (vllm bench's --num-prompts)?"),
    ("workload.max_concurrency",
     "workload.max_concurrency: unknown key; did you mean workload.arrival.num_users (vllm bench's --max-concurrency)?"),
    ("variants.0.policy.mnbt", "variants.0.policy.mnbt: unknown key; did you mean variants.0.policy.max_num_batched_tokens?"),
    ("deployment.dtype", "deployment.dtype: unknown key; did you mean deployment.weight_dtype (vLLM's --dtype)?"),
])
def test_a_set_key_in_the_wrong_section_names_the_section_that_has_it(key: str, line: str) -> None:
    """`--set deployment.max_num_seqs=8` (vLLM's engine argument, which servesim keeps in the policy section) was
    answered with the deployment's eighteen keys, max_num_seqs not among them; a scenario file with the same key
    already said 'did you mean max_num_seqs (a key of policy)?'. --set, sweeps and servesim.run(set=...) now name
    the section's own key elsewhere in the scenario (one deep: a key only some nested section has is no guess)."""
    from sim.config.scenario import apply_override

    with pytest.raises(ScenarioError) as e:
        apply_override(copy.deepcopy(BASE), key, 8)
    assert line in str(e.value), str(e.value)
    with pytest.raises(ScenarioError) as e:
        parse_scenario({**copy.deepcopy(BASE), "sweep": {"deployment.max_num_seqs": [8, 16]}}, source="s.yaml")
    assert "did you mean policy.max_num_seqs?" in str(e.value), str(e.value)


def test_equally_close_keys_are_all_named():
    """``top_`` is as close to ``top_k`` as to ``top_p``: the hint named top_p alone (difflib's pick on a tie, the
    larger string), a guess that reads as an answer."""

    class Sampling(BaseModel):
        top_k: int = 0
        top_p: float = 1.0
        temperature: float = 1.0

    assert closest_keys("top_", ["temperature", "top_k", "top_p"]) == ["top_k", "top_p"]
    assert closest_key("top_", ["top_p", "top_k"]) == "top_p"  # one key where one is needed: the first given
    assert unknown_key_hint(Sampling, ("top_",)) == "; did you mean top_k or top_p?"
    assert unknown_key_hint(Sampling, ("top_pp",)) == "; did you mean top_p?"  # no tie: one
    assert either(["a", "b", "c"]) == "a, b or c"


@pytest.mark.parametrize(("policy", "says"), [
    # "variants.0.policy.cls: required key is missing" stood above it, as if class were not written at all
    ({"type": "custom", "class": "my_policy.py:Mine"}, "s.yaml: variants.0.policy.class: unknown key; did you mean cls?"),
    # the kind's tag missing was all the union said: typ itself was never named
    ({"typ": "fcfs"}, "s.yaml: variants.0.policy.type: required key is missing (typ is written: did you mean type?)"),
    # another word for the kind (as other tools write it): no hint before, kind being no near spelling of type
    ({"kind": "fcfs"}, "s.yaml: variants.0.policy.type: required key is missing (kind is written: did you mean "
     "type?)"),
    ({"name": "fcfs"}, "s.yaml: variants.0.policy.type: required key is missing (name is written: did you mean "
     "type?)"),
])
def test_a_misspelt_required_key_is_one_line_naming_it(policy, says):
    assert _error(lambda r: r["variants"][0].update(policy=policy)) == says


@pytest.mark.parametrize(("change", "says"), [
    # a tournament spec and cluster.router take a bare kind; a scenario's policy said only "expected a mapping"
    (lambda r: r["variants"][0].update(policy="fcfs"), "s.yaml: variants.0.policy: expected a mapping of keys to "
     "values (got 'fcfs'): write {type: fcfs}"),
    (lambda r: r["variants"][0].update(policy="my_policy.py:Mine"), "s.yaml: variants.0.policy: expected a mapping "
     "of keys to values (got 'my_policy.py:Mine'): write {type: custom, cls: 'my_policy.py:Mine'}"),
    (lambda r: r["workload"].update(arrival="poisson"), "s.yaml: workload.arrival: expected a mapping of keys to "
     "values (got 'poisson'): write {type: poisson, ...}"),
    (lambda r: r["variants"][0].update(policy="fcfss"), "s.yaml: variants.0.policy: expected a mapping of keys to "
     "values (got 'fcfss')"),
])
def test_a_section_written_as_its_kinds_bare_name_is_shown_the_mapping(change, says):
    assert _error(change) == says


@pytest.mark.parametrize(("change", "says"), [
    (lambda r: r["deployment"].update(max_model_len="32k"), "s.yaml: deployment.max_model_len: expected an integer "
     "(got '32k'): give it in digits, 32768 or 32000 (no k or m)"),
    (lambda r: r["workload"].update(num_requests="1M"), "s.yaml: workload.num_requests: expected an integer (got "
     "'1M'): give it in digits, 1048576 or 1000000 (no k or m)"),
    (lambda r: r["deployment"].update(max_model_len="lots"), "s.yaml: deployment.max_model_len: expected an integer "
     "(got 'lots')"),
])
def test_a_size_written_with_k_or_m_is_told_its_digits(change, says):
    """vLLM's --max-model-len takes 32k (32,000; 32K is 32,768); a scenario's max_model_len: 32k said only "expected an
    integer (got '32k')", not which forms are taken."""
    assert _error(change) == says


@pytest.mark.parametrize(("arrival", "says"), [
    ({"type": "closed_loop", "concurrency": 8}, "s.yaml: workload.arrival.concurrency: unknown key; did you mean "
     "num_users (vllm bench's --max-concurrency)?"),
    ({"type": "poisson", "request_rate": 2.0}, "s.yaml: workload.arrival.request_rate: unknown key; did you mean "
     "rate (vllm bench's --request-rate)?"),
])
def test_a_required_key_written_under_vllms_name_is_one_line(arrival, says):
    """A required key written under vllm bench's option name was two lines, the first saying the key
    (num_users, rate) was missing, as if nothing had been written: the hint's source in brackets hid it from the
    rule that drops that line for a misspelt key."""
    assert _error(lambda r: r["workload"].update(arrival=arrival)) == says


@pytest.mark.parametrize(("key", "value"), [("prompt_len", 800), ("output_len", 200)])
def test_a_length_written_as_a_number_is_shown_the_fixed_kind(key, value):
    """prompt_len: 800 said only 'expected a mapping of keys to values (got 800)', not how to write a fixed length."""
    assert _error(lambda r: r["workload"].update({key: value})) == (
        f"s.yaml: workload.{key}: expected a mapping of keys to values (got {value}): write {{type: fixed, value: "
        f"{value}}}")


def test_a_number_where_no_fixed_kind_is_gets_no_hint():
    assert _error(lambda r: r["variants"][0].update(policy=8)) == (
        "s.yaml: variants.0.policy: expected a mapping of keys to values (got 8)")


@pytest.mark.parametrize(("change", "says"), [
    # nothing close to ttft_p99: "unknown key" alone, not what slos takes
    (lambda r: r.update(slos={"ttft_p99": 0.5}), "s.yaml: slos.ttft_p99: unknown key; expected one of e2el, tpot, "
     "ttft"),
    # a tagged union's section lists its own kind's keys, not every kind's
    (lambda r: r["workload"].update(arrival={"type": "poisson", "rate": 1.0, "rps": 1.0}),
     "s.yaml: workload.arrival.rps: unknown key; expected one of rate, type"),
    # a built-in policy was told "your class's constructor arguments go under args", which only a custom one takes
    (lambda r: r["variants"][0].update(policy={"type": "continuous", "foo": 1}),
     "s.yaml: variants.0.policy.foo: unknown key; expected one of capacity_scheduler_policy, enable_chunked_prefill, "
     "max_num_batched_tokens, max_num_seqs, preemption_mode, prefill_mode, type"),
])
def test_an_unknown_key_with_none_close_lists_what_its_section_takes(change, says):
    assert _error(change) == says


def test_numpys_lognormal_names_are_told_the_lengths_own():
    """prompt_len: {type: lognormal, mu: 6.5, sigma: 0.5} was four lines, sigma's saying 'did you mean sigma (a key
    of policy.predictor)?', a section the user never meant."""
    assert _error(lambda r: r["workload"].update(prompt_len={"type": "lognormal", "mu": 6.5, "sigma": 0.5})) == (
        "s.yaml: workload.prompt_len.mu: unknown key; did you mean mean (the length's mean in tokens, where numpy's "
        "lognormal mu is of its log)?\ns.yaml: workload.prompt_len.sigma: unknown key; did you mean std (the length's "
        "standard deviation in tokens, where numpy's lognormal sigma is of its log)?")


@pytest.mark.parametrize("value", [-5, 0, float("inf"), 12.5])
def test_a_number_no_fixed_length_takes_is_not_shown_as_one(value):
    """prompt_len: -5 was told 'write {type: fixed, value: -5}', which is refused in turn: the hint is given only
    for a number the fixed kind takes."""
    assert _error(lambda r: r["workload"].update(prompt_len=value)) == (
        f"s.yaml: workload.prompt_len: expected a mapping of keys to values (got {value})")


def test_mu_in_a_kind_without_mean_is_not_told_mean():
    """{type: fixed, mu: 3} was told 'did you mean mean (the length's mean ...)?', a key the fixed kind lacks."""
    assert "did you mean mean" not in _error(lambda r: r["workload"].update(prompt_len={"type": "fixed",
                                                                                          "value": 8, "mu": 3}))


@pytest.mark.parametrize(("change", "says"), [
    (lambda r: r["workload"]["arrival"].update({"rate": 7, 5: None}), "s.yaml: workload.arrival.rate: a number with "
     "a decimal comma is read as 7 and a key 5 (a comma ends an entry of a {...} mapping): write decimals with a point"),
    # slos: {ttft: 0,5}: "slos.ttft: must be greater than 0 (got 0)" stood above it too
    (lambda r: r.update(slos={"ttft": 0, 5: None}), "s.yaml: slos.ttft: a number with a decimal comma is read as 0 and "
     "a key 5 (a comma ends an entry of a {...} mapping): write decimals with a point"),
])
def test_a_decimal_comma_is_named_on_its_key(change, says):
    """rate: 7,5 in a {...} mapping, which YAML reads as rate 7 and a key 5, was told only
    'workload.arrival.5: Keys should be strings (got 5)'."""
    assert _error(change) == says
