"""The `torchneuron` command: doctor, run (CUDA scripts on neuron), verify, ops."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchneuron.tools import cli, launch, verify

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CUDA_SCRIPT = HERE / "cuda_script.py"
DISAGREE_SCRIPT = HERE / "disagree_script.py"
CONSOLE = Path(sys.executable).parent / "torchneuron"


def _cli(*args: str, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The installed console script (falls back to `python -m` if the venv has none)."""
    cmd = [str(CONSOLE)] if CONSOLE.exists() else [sys.executable, "-m", "torchneuron.tools.cli"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=cwd)


def _losses(text: str) -> list[float]:
    return [float(m) for m in re.findall(r"loss: ([-0-9.e+]+)", text)]


def test_console_script_installed_with_help() -> None:
    assert CONSOLE.exists(), "pip install -e . should install the `torchneuron` console script"
    result = _cli("--help", timeout=120)
    assert result.returncode == 0, result.stderr
    for command in ("doctor", "run", "verify", "ops"):
        assert command in result.stdout


@pytest.mark.parametrize("command", ["doctor", "run", "verify", "ops"])
def test_each_command_has_help(command: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, "--help"])
    assert exit_.value.code == 0
    assert "usage: torchneuron " + command in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "usage: torchneuron"),
        (["run", "no_such_script.py"], "script not found"),
        (["verify", "no_such_script.py"], "script not found"),
        (["verify", "--loss-regex", "(", str(CUDA_SCRIPT)], "not a valid regular expression"),
        (["verify", "--rtol", "-1", str(CUDA_SCRIPT)], "must be >= 0"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_misuse_exits_2_with_a_message(argv, message, capsys) -> None:
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_ops_without_a_recorded_run(tmp_path, capsys) -> None:
    assert cli.main(["ops", "--ops-file", str(tmp_path / "none.json")]) == 2
    assert "no recorded run" in capsys.readouterr().err


def test_doctor(capsys) -> None:
    # The self-test's default 10 s budget skips (and so fails) checks on a loaded machine: at
    # load average 15 the first elementwise check alone took 12 s. The checks are what is tested.
    assert cli.main(["doctor", "--budget", "120"]) == 0
    out = capsys.readouterr().out
    for text in ("torch: 2.13.0", "jax: ", "PJRT platform: ", "neuron:0 -> ", "compile backend",
                 "entry point registered", "all checks passed"):
        assert text in out, out


def test_default_loss_regex() -> None:
    pattern = re.compile(verify.DEFAULT_LOSS_REGEX)
    lines = [
        "step 0 loss 0.5", "step 1 loss: 0.25", "{'loss': 1e-3, 'grad_norm': 2.0}", "train_loss = .5",
        "Loss=nan", "epoch 1 val_loss: 9.0", "lossless compression", "no number here",
    ]
    got = verify.parse_losses([(0.0, line) for line in lines], pattern)
    values = [v for _, v in got]
    assert values[:4] == [0.5, 0.25, 1e-3, 0.5]
    assert len(values) == 5 and values[4] != values[4]  # nan; val_loss and the rest ignored


def test_remap_in_process() -> None:
    real_cuda = torch.cuda
    launch.install("neuron")
    try:
        assert torch.cuda.is_available() and torch.cuda.device_count() >= 1
        x = torch.randn(3, device="cuda")
        assert x.device.type == "neuron" and x.is_cuda
        assert torch.ones(2).cuda().device.type == "neuron"
        assert torch.zeros(2).to(torch.device("cuda", 0)).device == torch.device("neuron", 0)
        assert torch.nn.Linear(2, 2).to("cuda").weight.device.type == "neuron"
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert torch.is_autocast_enabled("neuron")
            assert (x[None] @ x[:, None]).dtype == torch.bfloat16
        with torch.cuda.amp.autocast(dtype=torch.float16):
            assert (x[None] @ x[:, None]).dtype == torch.float16
        assert torch.amp.GradScaler()._device == "neuron"
        torch.cuda.manual_seed(3)
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() >= 0
        assert "neuron" in torch.cuda.get_device_name(0)
        from torch.cuda import amp  # the submodule import sees the stand-in too

        assert amp.autocast is torch.cuda.amp.autocast
        assert torch.randn(2).device.type == "cpu"  # nothing else moves
    finally:
        launch.uninstall()
    assert torch.cuda is real_cuda and not torch.cuda.is_available()
    assert torch.ones(1, device="neuron").to("cpu").device.type == "cpu"


def test_cuda_script_fails_with_plain_python() -> None:
    result = subprocess.run([sys.executable, str(CUDA_SCRIPT), "--steps", "2"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0
    assert "CUDA" in result.stderr


def test_run_cuda_script_on_neuron_then_ops(tmp_path, capsys) -> None:
    ops_file = tmp_path / "ops.json"
    result = _cli("run", "--ops-file", str(ops_file), str(CUDA_SCRIPT), "--steps", "4", "--amp")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "running on neuron" in result.stdout
    losses = _losses(result.stdout)
    assert len(losses) == 4 and losses[-1] < losses[0], result.stdout
    assert "ops on neuron:" in result.stderr
    assert cli.main(["ops", "--ops-file", str(ops_file)]) == 0
    listed = capsys.readouterr().out
    assert "aten.mm.default" in listed or "aten.addmm.default" in listed
    assert "aten._amp_update_scale_.default" in listed  # GradScaler's helpers ran natively
    assert "0 fallback" in listed
    assert cli.main(["ops", "--json", "--ops-file", str(ops_file)]) == 0
    as_json = json.loads(capsys.readouterr().out)
    native = as_json["op_counts"]["native"]
    assert native and all(isinstance(n, int) and n > 0 for n in native.values())
    assert set(as_json["op_counts"]) == {"native", "decomposed", "fallback"}


def test_verify_example_agrees_and_writes_report(tmp_path) -> None:
    out = tmp_path / "report"
    result = _cli("verify", "--quiet", "--out", str(out), str(REPO / "examples" / "mlp.py"),
                  "--steps", "4")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "AGREE" in result.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["agree"] and report["steps"] == {"cpu": 4, "neuron": 4}
    assert report["max_rel_diff"] <= 1e-3
    assert [r["step"] for r in report["rows"]] == [0, 1, 2, 3]
    assert report["step_time_s"]["neuron"]["median"] is not None
    assert isinstance(report["fallback_ops"], dict)
    assert (out / "losses.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    assert "| step | cpu loss | neuron loss |" in md and "losses.png" in md
    assert "Ops that fell back to CPU" in md


@pytest.mark.slow  # two more interpreter runs; `make test` keeps the agreeing verify above
def test_verify_disagreement_exits_1(tmp_path) -> None:
    result = _cli("verify", "--out", str(tmp_path / "r"), "--call", "losses(device, 3)",
                  str(DISAGREE_SCRIPT))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "DIFFER" in result.stdout
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert not report["agree"] and report["max_rel_diff"] > 0.1
    assert report["steps"] == {"cpu": 3, "neuron": 3}


def test_tolerance_decides_agreement() -> None:
    cpu, neuron = [3.0, 1.5, 1.0], [3.5, 2.0, 1.5]
    assert not verify.compare(cpu, neuron, rtol=0.1, atol=0)["agree"]
    assert verify.compare(cpu, neuron, rtol=0.5, atol=0)["agree"]
    assert verify.compare(cpu, neuron, rtol=0, atol=0.5)["agree"]
    assert not verify.compare(cpu, neuron[:2], rtol=1, atol=1)["agree"]  # step counts differ
    assert not verify.compare([float("nan")], [float("nan")], rtol=1, atol=1)["agree"]


@pytest.mark.slow
def test_verify_without_losses_exits_3(tmp_path) -> None:
    result = _cli("verify", "--quiet", "--loss-regex", "no such line", "--out", str(tmp_path / "r"),
                  str(DISAGREE_SCRIPT))
    assert result.returncode == 3
    assert "no loss values" in result.stderr
