"""The simulator must work where torch is not installed: nothing under sim/ may import it."""

import subprocess
import sys


def test_sim_imports_without_torch() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked in this test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import sim.cli.main, sim.loop.run, sim.serving.core, sim.loop.simulator, sim.output.report, sim.config.scenario\n"
        "from sim.loop.run import run_scenario\n"
        "from sim.config.scenario import parse_scenario\n"
        "sc = parse_scenario({'workload': {'arrival': {'type': 'poisson', 'rate': 5}, 'num_requests': 20,\n"
        "    'prompt_len': {'type': 'fixed', 'value': 100}, 'output_len': {'type': 'fixed', 'value': 20}}})\n"
        "out = run_scenario(sc)\n"
        "assert out.summaries['scenario']['num_completed'] == 20\n"
        "assert 'torch' not in sys.modules\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"
