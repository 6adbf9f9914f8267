"""launch_server flags (SGLang names, --config, unknown/unsupported flags), configs/*.yaml, send_one's
output against the running server, and a clean exit on SIGINT with a request in flight."""

from __future__ import annotations

import dataclasses
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from jaxserve.engine.config import ServerArgs
from jaxserve.server.args import UnsupportedFlagError, parse_launch_args
from jaxserve.server.launch import LaunchError, resolve_model
from tests.server.conftest import ENGINE_FLAGS, ROOT, ServerProcess, flags_of

pytestmark = pytest.mark.slow  # builds models/engines or runs long: `pytest -m 'not slow'` skips it

SERVER_ARGS_FIELDS = {f.name for f in dataclasses.fields(ServerArgs)}
SPEC_SUPPORTED = "speculative_algorithm" in SERVER_ARGS_FIELDS


def test_flags_map_to_server_args():
    args = parse_launch_args(["--model-path", "/m", "--page-size", "16", "--max-total-tokens", "2048",
                              "--chunked-prefill-size", "128", "--max-running-requests", "8",
                              "--disable-radix-cache", "--dtype", "half", "--swa-full-tokens-ratio", "0.5",
                              "--attention-backend", "native", "--tp-size", "1", "--api-key", "k"])
    assert args.model_path == "/m" and args.api_key == "k" and (args.host, args.port) == ("127.0.0.1", 30000)
    assert args.engine_kwargs == {"page_size": 16, "max_total_tokens": 2048, "chunked_prefill_size": 128,
                                  "max_running_requests": 8, "disable_radix_cache": True, "dtype": "float16",
                                  "swa_full_tokens_ratio": 0.5, "attention_backend": "native", "tp_size": 1}
    ServerArgs(**args.engine_kwargs)  # accepted by the engine as is
    assert parse_launch_args([]).engine_kwargs == {}  # unset flags keep the engine's defaults


def test_model_is_an_alias_of_model_path_as_in_sglang():
    """The seed's command line is `launch_server --model ...`."""
    assert parse_launch_args(["--model", "/m"]).model_path == "/m"


@pytest.mark.parametrize("argv,needle", [(["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
                                         (["--page", "16"], "unrecognized arguments: --page"),
                                         (["--page-size", "x"], "--page-size: invalid int value"),
                                         (["--page-size", "0"], "page_size=0")])
def test_unknown_or_bad_flags_exit_with_a_message(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_launch_args(argv)
    assert exc.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("argv,flag", [(["--tp-size", "2"], "--tp-size"),
                                       (["--mem-fraction-static", "0.8"], "--mem-fraction-static")])
def test_flags_the_engine_cannot_honour_fail_by_name(argv, flag):
    name = flag[2:].replace("-", "_")
    if name in SERVER_ARGS_FIELDS:
        assert name in parse_launch_args(argv).engine_kwargs
        return
    with pytest.raises(UnsupportedFlagError, match=f"{flag} .*not supported yet"):
        parse_launch_args(argv)


def test_sglang_attention_backend_names_are_accepted_and_logged():
    from jaxserve.layers.backends import available_backends

    args = parse_launch_args(["--attention-backend", "triton"])
    assert args.engine_kwargs["attention_backend"] in available_backends()
    assert args.attention_choice.requested == "triton"
    assert args.engine_kwargs["attention_backend"] in args.attention_choice.message


def test_unknown_attention_backend_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_launch_args(["--attention-backend", "trition"])
    assert exc.value.code == 2 and "trition: unknown name" in capsys.readouterr().err


def test_speculative_algorithm_on_the_embedded_default_uses_the_embedded_head(capsys):
    from jaxserve.assets import EMBEDDED_DRAFT_DIR

    args = parse_launch_args(["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "2",
                              "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"])
    _, kwargs = resolve_model(args)
    assert kwargs["speculative_draft_model_path"] == str(EMBEDDED_DRAFT_DIR)
    assert kwargs["speculative_num_steps"] == 2 and kwargs["speculative_num_draft_tokens"] == 3
    assert "using the embedded EAGLE-3 head" in capsys.readouterr().err


def test_speculative_flags_are_passed_or_fail_clearly():
    argv = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d",
            "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "3"]
    if SPEC_SUPPORTED:
        kwargs = parse_launch_args(argv).engine_kwargs
        assert kwargs["speculative_algorithm"] == "EAGLE3" and kwargs["speculative_num_steps"] == 2
    else:
        with pytest.raises(UnsupportedFlagError, match="--speculative-algorithm EAGLE3: not supported yet"):
            parse_launch_args(argv)


def test_config_file_is_merged_under_explicit_flags(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("model-path: /from/config\npage_size: 16\nmax-total-tokens: 1024\n")
    args = parse_launch_args(["--config", str(config), "--page-size", "32"])
    assert args.model_path == "/from/config"
    assert args.engine_kwargs == {"page_size": 32, "max_total_tokens": 1024}
    config.write_text("page-size: 16\nspeculative_algo: EAGLE3\n")
    with pytest.raises(SystemExit):
        parse_launch_args(["--config", str(config)])
    assert "unknown key(s) ['speculative_algo']" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_parse(path):
    text = path.read_text()
    if "speculative-algorithm" in text and not SPEC_SUPPORTED:
        with pytest.raises(UnsupportedFlagError, match="--speculative-algorithm"):
            parse_launch_args(["--config", str(path)])
        return
    args = parse_launch_args(["--config", str(path)])
    assert args.model_path and args.engine_kwargs["page_size"] == 16
    ServerArgs(**args.engine_kwargs)


def test_names_of_shipped_configs():
    names = {p.name for p in (ROOT / "configs").glob("*.yaml")}
    assert {"embedded-default.yaml", "gpt-oss-20b-eagle3.yaml", "llama-3-8b.yaml", "gemma-3-4b.yaml",
            "qwen3-8b.yaml"} <= names


def test_default_model_is_the_embedded_one_or_a_clear_error():
    from jaxserve.assets import EMBEDDED_MODEL_DIR, embedded_model_available

    args = parse_launch_args([])
    if embedded_model_available():
        assert resolve_model(args)[0] == str(EMBEDDED_MODEL_DIR)
    else:
        with pytest.raises(LaunchError, match="embedded default model is missing"):
            resolve_model(args)


def test_launch_server_process_reports_a_tp_size_beyond_the_devices():
    out = subprocess.run([sys.executable, "-m", "jaxserve.launch_server", "--tp-size", "4"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    # the embedded default launches with its EAGLE-3 head (replicated under tensor parallelism); the mesh
    # of 4 devices is what fails on this machine
    assert out.returncode == 1 and "error: tp_size" in out.stderr


def run_send_one(server, *extra: str) -> str:
    port = server.url.rsplit(":", 1)[1]
    out = subprocess.run([sys.executable, "-m", "jaxserve.test.send_one", "--host", "127.0.0.1",
                          "--port", port, *extra], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_send_one_prints_text_and_acc_length_table(server, reference, stream):
    from jaxserve.test.send_one import DEFAULT_PROMPT, STOP

    stdout = run_send_one(server, "--max-new-tokens", "12", *(["--stream"] if stream else []))
    text, ids = reference.generate(DEFAULT_PROMPT, 12, stop=STOP)
    lines = stdout.rstrip("\n").split("\n")
    assert "\n".join(lines[:-7]) == text  # the text, SGLang's two lines, then a 5-line table
    assert lines[-7] == "acc_length=1.00" and re.fullmatch(r"speed=\d+\.\d\d token/s", lines[-6])
    assert [c.strip() for c in lines[-4].strip("|").split("|")] == ["Latency (s)", "Tokens", "Acc Length",
                                                                   "Speed (token/s)"]
    latency, tokens, acc_length, speed = (c.strip() for c in lines[-2].strip("|").split("|"))
    assert int(tokens) == len(ids) and acc_length == "1.000"  # no speculative decoding: 1.0 by definition
    assert float(latency) > 0 and float(speed) == pytest.approx(len(ids) / float(latency), rel=0.05, abs=0.05)


def test_send_one_reports_http_errors(server):
    port = server.url.rsplit(":", 1)[1]
    out = subprocess.run([sys.executable, "-m", "jaxserve.test.send_one", "--port", port,
                          "--host", "127.0.0.1", "--max-new-tokens", "-1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Error: HTTP 400" in out.stdout and "max_new_tokens" in out.stdout


def test_sigint_with_a_request_in_flight_exits_cleanly(model_dir):
    proc = ServerProcess(["--model-path", str(model_dir), *flags_of(ENGINE_FLAGS)])
    chunks: list[str] = []

    def stream():
        body = {"input_ids": [5] * 10, "stream": True,
                "sampling_params": {"max_new_tokens": 240, "ignore_eos": True, "temperature": 0}}
        try:
            with httpx.stream("POST", proc.url + "/generate", json=body, timeout=60) as r:
                chunks.extend(line for line in r.iter_lines() if line.startswith("data: "))
        except httpx.HTTPError:
            pass

    thread = threading.Thread(target=stream)
    thread.start()
    while not chunks and thread.is_alive():
        thread.join(0.01)
    assert proc.stop(signal.SIGINT, timeout_s=30) == 0, "".join(proc.stderr[-20:])
    thread.join(30)
    assert chunks and not thread.is_alive()
    assert not any("Traceback" in line for line in proc.stderr), "".join(proc.stderr[-30:])


def test_run_as_module_help_lists_sglang_flags():
    out = subprocess.run([sys.executable, "-m", "jaxserve.launch_server", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    for flag in ("--model-path", "--tokenizer-path", "--page-size", "--max-total-tokens",
                 "--mem-fraction-static", "--chunked-prefill-size", "--max-running-requests",
                 "--disable-radix-cache",
                 "--swa-full-tokens-ratio", "--attention-backend", "--speculative-algorithm",
                 "--speculative-draft-model-path", "--speculative-num-steps", "--speculative-eagle-topk",
                 "--speculative-num-draft-tokens", "--tp-size", "--api-key", "--config"):
        assert flag in out.stdout
    assert Path(ROOT / "jaxserve" / "launch_server.py").exists()
