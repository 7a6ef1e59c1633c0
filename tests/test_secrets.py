"""Credentials inside URIs are masked in everything logged."""

from __future__ import annotations

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
