"""Credentials inside URIs are masked in everything logged."""

from __future__ import annotations

import pytest

from scalerl.tracking.secrets import redact, redact_tree


def test_a_password_in_a_uri_is_masked():
    assert (
        redact("postgresql://alice:s3cr3t@db.example:5432/mlflow")
        == "postgresql://alice:***@db.example:5432/mlflow"
    )
    assert redact("https://ghp_TOKEN123@host/x") == "https://***@host/x"
    assert redact("see http://u:p@h and https://v:q@k/") == "see http://u:***@h and https://v:***@k/"


def test_uris_without_credentials_are_unchanged():
    for s in ("sqlite:///tmp/m.db", "http://127.0.0.1:5000", "file:///a/b@c", "user@example.com", "plain"):
        assert redact(s) == s


def test_nested_values_are_masked():
    tree = {"tracking": {"uri": "mysql://root:pw@127.0.0.1/db"}, "list": ["http://a:b@c"], "n": 3}
    assert redact_tree(tree) == {
        "tracking": {"uri": "mysql://root:***@127.0.0.1/db"},
        "list": ["http://a:***@c"],
        "n": 3,
    }


@pytest.mark.slow
def test_a_password_in_the_tracking_uri_is_never_logged(tmp_path, monkeypatch):
    """A real MLflow server (it ignores the credentials); params, the config artifact and
    run_info.json hold the URI with its password masked. Environment secrets are not logged at all."""
    import json

    from mlflow.tracking import MlflowClient
    from mlflow_server import free_port, start_server, stop_server
    from omegaconf import OmegaConf

    from scalerl.config import compose, typed
    from scalerl.tracking import Tracker, run_params

    monkeypatch.setenv("HF_TOKEN", "hf_FAKE_ENV_TOKEN_123")
    port = free_port()
    proc = start_server(tmp_path, port)
    try:
        uri = f"http://alice:s3cr3t-pw@127.0.0.1:{port}"
        out = tmp_path / "run"
        out.mkdir()
        cfg = compose([f"tracking.uri={uri}", "tracking.experiment=secrets", f"out_dir={out}"])
        tr = Tracker(typed(cfg).tracking, out)
        run_id = tr.start(None, run_params(cfg), config_yaml=OmegaConf.to_yaml(cfg, resolve=True))
        client = MlflowClient(f"http://127.0.0.1:{port}")
        run = client.get_run(run_id)
        logged = [json.dumps(run.data.params), json.dumps(run.data.tags), (out / "run_info.json").read_text()]
        logged.append(open(client.download_artifacts(run_id, "config.yaml", str(tmp_path))).read())
        for text in logged:
            assert "s3cr3t-pw" not in text and "hf_FAKE_ENV_TOKEN_123" not in text
        assert run.data.params["tracking.uri"] == f"http://alice:***@127.0.0.1:{port}"
        # the server (and its workers) listen on loopback only
        from procs import descendants, listening_addresses

        addrs = [
            a for pid in (proc.pid, *descendants(proc.pid)) for a in _listening(listening_addresses, pid)
        ]
        assert addrs and {a for a, _ in addrs} == {"127.0.0.1"}, addrs
    finally:
        stop_server(proc, graceful=False)


def _listening(listening_addresses, pid: int) -> list:
    try:
        return listening_addresses(pid)
    except OSError:  # the process ended meanwhile
        return []
