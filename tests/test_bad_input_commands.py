"""Bad input to the real CLI, as a new user would type it: every case is refused with one line on stderr
(`asp-npu <cmd>: error: ...`, or `check`'s one line per problem), exit code 2, no traceback, within a
time limit, and a previous run directory it points at is left exactly as it was.

The table is (class, command, expected text in stderr); `{ws}` is a folder of prepared bad files and
`{repo}` the checkout. Classes follow the hardening issue: bad values accepted, tracebacks on wrong
types / torn files, destroyed data, unwritable outputs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "deploy" / "fixtures"
TIME_LIMIT_S = 180
CONFIG = "--config={repo}/configs/cpu_tiny.yaml"
SMALL = ["data.num_prompts=12", "rl_config.n_samples_per_prompt=4", "rl_config.mini_batch_size=8",
         "trainer.device=cpu", "model.warm_start_steps=0"]
TRAIN = ["train", CONFIG, *SMALL]

VALUE, TYPE, TORN, DATA, WRITE = ("bad value accepted", "wrong type", "torn or undecodable file",
                                  "destroyed data", "unwritable output")

# (class, command, expected text in stderr)
CASES: list[tuple[str, list[str], str]] = [
    # check: every numeric field's range, NaN and inf included, all problems listed
    (VALUE, ["check", CONFIG, "--no-sim", "actor_config.lr=nan"], "actor_config.lr: must be a finite"),
    (VALUE, ["check", CONFIG, "--no-sim", "generate_config.sampling_config.temperature=-1"],
     "sampling_config.temperature: must be >= 0"),
    (VALUE, ["check", CONFIG, "--no-sim", "generate_config.sampling_config.top_p=5"],
     "sampling_config.top_p: must be in (0, 1]"),
    (VALUE, ["check", CONFIG, "--no-sim", "generate_config.kv_cache_gib=-1"], "generate_config.kv_cache_gib"),
    (VALUE, ["check", CONFIG, "--no-sim", "data.num_prompts=-1"], "data.num_prompts"),
    (VALUE, ["check", CONFIG, "--no-sim", "trainer.stall_timeout_s=nan"], "trainer.stall_timeout_s"),
    (VALUE, ["check", CONFIG, "--no-sim", "trainer.stall_timeout_s=-5"], "trainer.stall_timeout_s"),
    (VALUE, ["check", CONFIG, "--no-sim", "trainer.logger=[console,mlflow]"], "trainer.logger: 'mlflow'"),
    (VALUE, ["check", CONFIG, "--no-sim", "rl_config.plan_cost_a=inf"], "rl_config.plan_cost_a"),
    (VALUE, ["check", CONFIG, "--no-sim", "actor_config.tensor_model_parallel_size=0"],
     "actor_config.tensor_model_parallel_size: must be >= 1"),
    (VALUE, ["check", CONFIG, "--no-sim", "rl_config.importance_cap=-inf"], "rl_config.importance_cap"),
    (VALUE, ["check", CONFIG, "--no-sim", "generate_config.gpu_memory_utilization=1.5"],
     "generate_config.gpu_memory_utilization"),
    (TYPE, ["check", CONFIG, "--no-sim", "actor_config.micro_batch_size=eight"], "micro_batch_size"),
    (VALUE, ["check", CONFIG, "--no-sim", "actor_config.lora_r=8",
             "actor_config.lora_target_modules=[q_proj]"],
     "actor_config.lora_target_modules: 'q_proj' is not a layer LoRA applies to"),
    (VALUE, ["check", CONFIG, "--no-sim", "actor_config.lora_r=0",
             "actor_config.lora_target_modules=[linear_qkv]"],
     "actor_config.lora_r: must be >= 1 when lora_target_modules is set (got 0)"),
    # train preflight: refused before any actor starts, no run directory made
    (VALUE, [*TRAIN, "trainer.run_dir={ws}/new_run", "actor_config.lr=nan"], "actor_config.lr"),
    (VALUE, [*TRAIN, "trainer.run_dir={ws}/new_run", "generate_config.sampling_config.top_p=5"], "top_p"),
    (VALUE, [*TRAIN, "trainer.run_dir={ws}/new_run", "data.num_prompts=-1"], "data.num_prompts"),
    (VALUE, [*TRAIN, "trainer.run_dir={ws}/new_run", "trainer.stall_timeout_s=-1"], "stall_timeout_s"),
    (VALUE, [*TRAIN, "trainer.run_dir={ws}/new_run", "trainer.logger=[tensorbored]"], "trainer.logger"),
    (VALUE, [*TRAIN, "trainer.run_dir={ws}/new_run", "generate_config.kv_cache_gib=-2"], "kv_cache_gib"),
    (TYPE, [*TRAIN, "trainer.run_dir={ws}/new_run", "rl_config.max_lag=one"], "rl_config.max_lag"),
    (TYPE, [*TRAIN, "trainer.run_dir={ws}/new_run", "model.path={ws}/torn_model"], "config.json"),
    (TYPE, [*TRAIN, "trainer.run_dir={ws}/new_run", "model.path={ws}/list_model"], "config.json"),
    # an existing run directory is not touched by a refused start
    (DATA, [*TRAIN, "trainer.run_dir={ws}/old_run", "model.path={ws}/torn_model"], "not valid JSON"),
    (DATA, [*TRAIN, "trainer.run_dir={ws}/old_run_no_ckpt", "data.data_path={ws}/missing.jsonl"],
     "missing.jsonl"),
    (DATA, [*TRAIN, "--overwrite", "trainer.run_dir={ws}/old_run", "data.data_path={ws}/missing.jsonl"],
     "missing.jsonl"),
    (DATA, ["bench", "real", CONFIG, "--modes", "asp", "--iterations", "1", "--out-dir", "{ws}/bench",
            *SMALL], "--overwrite"),
    # partial rollout: a token bound below max_lag, or a synchronous mode (issue 17)
    (VALUE, [*TRAIN, "trainer.run_dir={ws}/new_run", "rl_config.max_lag=2", "rl_config.max_token_lag=1"],
     "max_token_lag: must be >="),
    (VALUE, [*TRAIN, "trainer.run_dir={ws}/new_run", "rl_config.mode=mindspeed-sync",
             "rl_config.partial_rollout=true"], "synchronous or colocated"),
    (VALUE, ["bench", "real", CONFIG, "--modes", "mindspeed-sync", "--partial-rollout", "--out-dir",
             "{ws}/new_run", *SMALL], "none of the selected modes"),
    (VALUE, ["bench", "real", CONFIG, "--modes", "asp", "--partial-rollout", "--out-dir", "{ws}/new_run",
             *SMALL, "rl_config.max_token_lag=0"], "max_token_lag"),
    # import-config: wrong types, nulls and zero sizes in a MindSpeed-RL file
    (TYPE, ["import-config", "mindspeed-rl", "{ws}/ms_tp0.yaml", "--out", "{ws}/o.yaml"],
     "tensor_model_parallel_size: must be >= 1"),
    (TYPE, ["import-config", "mindspeed-rl", "{ws}/ms_itp0.yaml", "--out", "{ws}/o.yaml"],
     "infer_tensor_parallel_size: must be >= 1"),
    (TYPE, ["import-config", "mindspeed-rl", "{ws}/ms_seed_str.yaml", "--out", "{ws}/o.yaml"],
     "megatron_training.seed: expected an integer"),
    (TYPE, ["import-config", "mindspeed-rl", "{ws}/ms_npus_frac.yaml", "--out", "{ws}/o.yaml"],
     "num_npus: expected an integer"),
    (TYPE, ["import-config", "mindspeed-rl", "{ws}/ms_rl_list.yaml", "--out", "{ws}/o.yaml"],
     "rl_config: expected a mapping"),
    (TYPE, ["import-config", "mindspeed-rl", "{ws}/ms_gmu_str.yaml", "--out", "{ws}/o.yaml"],
     "gpu_memory_utilization: expected a number"),
    (TYPE, ["import-config", "mindspeed-rl", "{ws}/ms_n_str.yaml", "--out", "{ws}/o.yaml"],
     "n_samples_per_prompt: expected an integer"),
    (TYPE, ["import-config", "mindspeed-rl", "{ws}/ms_kl_str.yaml", "--out", "{ws}/o.yaml"],
     "init_kl_coef: expected a number"),
    (TYPE, ["import-config", "mindspeed-rl", "{ws}/moe/dapo_vocab_str.yaml", "--out", "{ws}/o.yaml"],
     "padded_vocab_size: expected an integer"),
    (TORN, ["import-config", "mindspeed-rl", "{ws}/not_utf8.yaml", "--out", "{ws}/o.yaml"], "not_utf8.yaml"),
    # report: torn or mistyped run files
    (TORN, ["report", "{ws}/run_metrics_list"], "metrics.jsonl: row 1 is not a JSON object"),
    (TORN, ["report", "{ws}/run_metrics_bytes"], "metrics.jsonl: not UTF-8"),
    (TORN, ["report", "{ws}/run_summary_torn"], "summary.json: not valid JSON"),
    (TORN, ["report", "{ws}/run_summary_list"], "summary.json: expected a JSON object"),
    (TORN, ["report", "{ws}/run_queue_torn"], "queue.jsonl:1: not a JSON line"),
    (TORN, ["report", "{ws}/run_samples_type"], "samples.jsonl: row 1: 'policy_version'"),
    (TORN, ["report", "{ws}/run_metrics_step"], "metrics.jsonl: row 1: 'step'"),
    (WRITE, ["report", "{ws}/run_ok", "--out", "{ws}/no_such_folder/r.png"], "does not exist"),
    # init-model: an output that cannot be written is refused before the model is built
    (WRITE, ["init-model", "--out", "/proc/asp_npu_model", "--size", "small"], "/proc/asp_npu_model"),
    (WRITE, ["init-model", "--out", "{ws}/a_file.txt/model"], "a_file.txt is not a folder"),
    (WRITE, ["init-model", "--out", "/dev/null"], "not a regular file"),
    # every output that is not a regular file (or folder) is refused, never replaced
    (WRITE, [*TRAIN, "trainer.run_dir=/dev/null"], "not a folder"),
    (WRITE, [*TRAIN, "trainer.run_dir={ws}/a_file.txt/run"], "a_file.txt is not a folder"),
    (WRITE, ["bench", "real", CONFIG, "--modes", "asp", "--out-dir", "/dev/null", *SMALL], "not a folder"),
    (WRITE, ["sft", CONFIG, "--out", "/dev/null", "sft.steps=1"], "not a regular file"),
    (WRITE, ["sft", CONFIG, "--out", "{ws}/a_file.txt/m", "sft.steps=1"], "a_file.txt is not a folder"),
    (WRITE, ["calibrate", CONFIG, "--out", "/dev/null"], "not a regular file"),
    (WRITE, ["calibrate", CONFIG, "--out", "{ws}"], "is a directory"),
    (WRITE, ["import-config", "mindspeed-rl", "{ws}/ms_tp0.yaml", "--out", "/dev/full"],
     "not a regular file"),
    (WRITE, ["report", "{ws}/run_ok", "--out", "/dev/null"], "not a regular file"),
    (WRITE, ["report", "{ws}/run_ok", "--out", "{ws}/run_ok"], "is a directory"),
    # a refused replacement of a model folder leaves the previous model as it was
    (DATA, ["init-model", "--force", "--out", "{ws}/old_model", "--arch", "gpt5"], "unknown architecture"),
    (DATA, ["sft", CONFIG, "--out", "{ws}/old_model", "model.path={ws}/torn_model", "sft.steps=1"],
     "config.json: not valid JSON"),
    (DATA, [*TRAIN, "--overwrite", "trainer.run_dir={ws}/old_run", "actor_config.lr=nan"], "actor_config.lr"),
    (DATA, [*TRAIN, "trainer.run_dir={ws}/old_run_no_ckpt", "model.path={ws}/torn_model"], "not valid JSON"),
    # sft / calibrate with a truncated or mistyped model config.json
    (TORN, ["sft", CONFIG, "model.path={ws}/torn_model", "sft.steps=1"], "config.json: not valid JSON"),
    (TORN, ["sft", CONFIG, "model.path={ws}/list_model", "sft.steps=1"], "config.json: expected a JSON"),
    (TORN, ["sft", CONFIG, "model.path={ws}/bytes_model", "sft.steps=1"], "config.json: not UTF-8"),
    (VALUE, ["sft", CONFIG, "sft.batch_size=0"], "sft.batch_size: must be >= 1"),
    (TORN, ["calibrate", CONFIG, "--out", "{ws}/c.json", "model.path={ws}/torn_model"], "config.json"),
    (TORN, ["calibrate", CONFIG, "--out", "{ws}/c.json", "model.path={ws}/bytes_model"], "config.json"),
    (VALUE, ["calibrate", CONFIG, "--out", "{ws}/c.json", "generate_config.kv_cache_gib=nan"],
     "kv_cache_gib"),
]

# run directories whose contents a refused command must leave exactly as they were
KEPT = ("old_run", "old_run_no_ckpt", "bench", "old_model")


def _ms_variant(ws: Path, name: str, dotted: str, value: object) -> None:
    cfg = OmegaConf.load(FIXTURES / "grpo_qwen25_7b_A3.yaml")
    OmegaConf.update(cfg, dotted, value, force_add=True)
    OmegaConf.save(cfg, ws / name)


def _run_dir(folder: Path, checkpoints: bool, **files: str | bytes) -> None:
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "config.yaml").write_text("old: 1\n")
    named = {"metrics.jsonl": '{"step": 1, "reward/mean": 0.5}\n', "summary.json": '{"mode": "asp"}'}
    named.update({k.replace("__", "."): v for k, v in files.items()})
    for name, text in named.items():
        (folder / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    if checkpoints:
        (folder / "checkpoints" / "final").mkdir()
        (folder / "checkpoints" / "final" / "latest.json").write_text('{"step": 6}')


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("bad_input")
    for name, text in (("torn_model", b'{"model_type": "qwen2", "hidden'), ("list_model", b"[1, 2]"),
                       ("bytes_model", b'\xff\xfe{"model_type"')):
        (ws / name).mkdir()
        (ws / name / "config.json").write_bytes(text)
    _run_dir(ws / "old_run", checkpoints=True)
    _run_dir(ws / "old_run_no_ckpt", checkpoints=False)
    _run_dir(ws / "bench" / "asp_s1234", checkpoints=True)
    _run_dir(ws / "run_ok", checkpoints=False)
    _run_dir(ws / "run_metrics_list", False, metrics__jsonl="[1, 2]\n")
    _run_dir(ws / "run_metrics_bytes", False, metrics__jsonl=b'\xff{"step": 1}\n')
    _run_dir(ws / "run_metrics_step", False, metrics__jsonl='{"step": "one"}\n')
    _run_dir(ws / "run_summary_torn", False, summary__json='{"mode": "as')
    _run_dir(ws / "run_summary_list", False, summary__json="[]")
    _run_dir(ws / "run_queue_torn", False, queue__jsonl='{"t": 1.0, "occ')
    _run_dir(ws / "run_samples_type", False, samples__jsonl='{"step": 1, "policy_version": "v1"}\n')
    _ms_variant(ws, "ms_tp0.yaml", "actor_config.tensor_model_parallel_size", 0)
    _ms_variant(ws, "ms_itp0.yaml", "generate_config.infer_tensor_parallel_size", 0)
    _ms_variant(ws, "ms_seed_str.yaml", "megatron_training.seed", "abc")
    _ms_variant(ws, "ms_npus_frac.yaml", "rl_config.actor_resource.num_npus", 2.5)
    _ms_variant(ws, "ms_gmu_str.yaml", "generate_config.gpu_memory_utilization", "high")
    _ms_variant(ws, "ms_n_str.yaml", "rl_config.n_samples_per_prompt", "eight")
    _ms_variant(ws, "ms_kl_str.yaml", "rl_config.init_kl_coef", [0.1])
    cfg = OmegaConf.load(FIXTURES / "grpo_qwen25_7b_A3.yaml")
    cfg.rl_config = [1, 2]
    OmegaConf.save(cfg, ws / "ms_rl_list.yaml")
    (ws / "not_utf8.yaml").write_bytes(b"actor_config:\n  lr: \xff\xfe\n")
    (ws / "moe" / "model").mkdir(parents=True)
    dapo = OmegaConf.load(FIXTURES / "dapo_moe_demo_A3.yaml")
    OmegaConf.save(dapo, ws / "moe" / "dapo_vocab_str.yaml")
    model = OmegaConf.load(FIXTURES / "model" / "moe_demo_30b.yaml")
    model.moe_demo_30b.padded_vocab_size = "big"
    OmegaConf.save(model, ws / "moe" / "model" / "moe_demo_30b.yaml")
    (ws / "a_file.txt").write_text("not a folder")
    (ws / "old_model").mkdir()
    (ws / "old_model" / "config.json").write_text('{"model_type": "qwen2"}')
    (ws / "old_model" / "model.safetensors").write_bytes(b"old weights")
    return ws


def _snapshot(folder: Path) -> list[tuple[str, bytes]]:
    return sorted((str(p.relative_to(folder)), p.read_bytes() if p.is_file() else b"")
                  for p in folder.rglob("*"))


def run_cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "VLLM_HOST_IP": "127.0.0.1", "MASTER_ADDR": "127.0.0.1",
           "GLOO_SOCKET_IFNAME": "lo", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "asp_npu.cli", *argv], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the command and whatever it started (Ray, engines)
        out, err = proc.communicate()
        err += f"\n(killed after {TIME_LIMIT_S} s: a hang)"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize(("klass", "command", "expected"), CASES,
                         ids=[f"{i:02d}-{c[1][0]}" for i, c in enumerate(CASES)])
def test_bad_input_is_refused_in_one_line(ws: Path, klass: str, command: list[str], expected: str) -> None:
    argv = [a.format(ws=ws, repo=REPO) for a in command]
    kept = {name: _snapshot(ws / name) for name in KEPT}
    made = [ws / "new_run", ws / "no_such_folder"]  # outputs a refused command must not create
    existed = {p: p.exists() for p in made}
    res = run_cli(argv, ws)
    err = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2, (klass, argv, res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert all(line.startswith("asp-npu ") for line in err), err
    if argv[0] != "check":  # check lists every problem, one line each, then a summary line
        assert len(err) == 1, err
    assert any(expected in line for line in err), (expected, err)
    for name, before in kept.items():
        assert _snapshot(ws / name) == before, f"{name} was changed by {argv}"
    for p in made:
        assert existed[p] or not p.exists(), f"{p} was created by {argv}"


def test_import_config_null_vocab_falls_back(tmp_path: Path) -> None:
    """A YAML null (padded_vocab_size: ~) means unset: the vocab size comes from vocab_size instead."""
    (tmp_path / "model").mkdir()
    OmegaConf.save(OmegaConf.load(FIXTURES / "dapo_moe_demo_A3.yaml"), tmp_path / "dapo.yaml")
    model = OmegaConf.load(FIXTURES / "model" / "moe_demo_30b.yaml")
    model.moe_demo_30b.padded_vocab_size = None
    model.moe_demo_30b.vocab_size = 151000
    OmegaConf.save(model, tmp_path / "model" / "moe_demo_30b.yaml")
    res = run_cli(["import-config", "mindspeed-rl", str(tmp_path / "dapo.yaml"), "--out",
                   str(tmp_path / "o.yaml"), "--mode", "mindspeed-sync"], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert OmegaConf.load(tmp_path / "o.yaml").model.arch.vocab_size == 151000
