"""The client's own logic without a server: specs, errors, names and connection settings."""

import os

import grpc
import pytest

import loom
from loom import connection


def test_yaml_file_becomes_the_spec_loomctl_would_send(repo_root):
    spec = loom.load_spec(repo_root / "examples" / "demo.yaml")
    assert spec.name == "tiny-demo"
    assert spec.model.preset == "tiny"
    assert spec.train.steps == 300
    assert spec.train.global_batch_tokens == 1024
    assert spec.train.lr == pytest.approx(3.0e-3)
    assert spec.resources.cpu_devices == 1
    assert spec.parallelism.HasField("auto")


def test_unknown_key_is_invalid_argument_naming_the_key_and_the_fix():
    with pytest.raises(loom.InvalidArgument) as e:
        loom.spec_from_dict({"model": {"prest": "tiny"}})
    assert e.value.field == "spec.model.prest"
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "did you mean 'preset'" in e.value.message


def test_wrong_value_type_names_its_path():
    with pytest.raises(loom.InvalidArgument) as e:
        loom.spec_from_dict({"train": {"steps": "many"}})
    assert e.value.field == "spec.train.steps"
    with pytest.raises(loom.InvalidArgument) as e:
        loom.spec_from_dict({"model": 5})
    assert e.value.field == "spec.model"


def test_json_and_proto_names_empty_messages_and_numeric_strings(tmp_path):
    spec = loom.spec_from_dict({
        "train": {"globalBatchTokens": 64, "warmup_steps": 2},
        "parallelism": {"auto": None},
        "env": {"STEPS": 5},
        "name": None,
    })
    assert spec.train.global_batch_tokens == 64 and spec.train.warmup_steps == 2
    assert spec.parallelism.HasField("auto")
    assert spec.env["STEPS"] == "5"
    assert spec.name == ""


def test_relative_paths_of_a_yaml_file_resolve_against_its_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "job.yaml"
    path.write_text("data: {path: ../tokens.bin}\ncheckpoint: {dir: /abs/ckpt}\n")
    spec = loom.load_spec(str(path))
    assert spec.data.path == str(tmp_path / "tokens.bin")
    assert spec.checkpoint.dir == "/abs/ckpt"


def test_missing_spec_file_is_not_found(tmp_path):
    with pytest.raises(loom.NotFound, match="cannot read job spec"):
        loom.load_spec(str(tmp_path / "absent.yaml"))


def test_malformed_yaml_is_invalid_argument():
    with pytest.raises(loom.InvalidArgument, match="not valid YAML"):
        loom.spec_from_yaml("model: {preset: tiny")


def test_errors_carry_code_and_leading_field():
    e = loom.errors.error_for(grpc.StatusCode.INVALID_ARGUMENT,
                              'spec.env["LD_PRELOAD"]: refused; remove it')
    assert isinstance(e, loom.InvalidArgument) and e.field == 'spec.env["LD_PRELOAD"]'
    e = loom.errors.error_for(grpc.StatusCode.NOT_FOUND, "jobs/x not found")
    assert isinstance(e, loom.NotFound) and e.field is None
    e = loom.errors.error_for(grpc.StatusCode.DATA_LOSS, "lost")
    assert type(e) is loom.LoomError and e.code == grpc.StatusCode.DATA_LOSS
    assert str(e) == "DATA_LOSS: lost"


def test_job_names_as_users_type_them():
    assert loom.job_name("abc") == "jobs/abc"
    assert loom.job_name("jobs/abc") == "jobs/abc"
    for bad in ("", "jobs/", "nodes/x", "a b"):
        with pytest.raises(loom.InvalidArgument) as e:
            loom.job_name(bad)
        assert e.value.field == "name"


def test_request_ids_are_fresh_32_hex_digits():
    a, b = loom.new_request_id(), loom.new_request_id()
    assert a != b and len(a) == 32 and int(a, 16) >= 0


def test_token_file_rules(tmp_path, monkeypatch):
    monkeypatch.delenv("LOOM_TOKEN", raising=False)
    token = tmp_path / "token"
    token.write_text("  secret \nsecond line\n")
    os.chmod(token, 0o644)
    with pytest.raises(loom.FailedPrecondition, match="chmod 600"):
        connection.resolve_token(None, str(token))
    os.chmod(token, 0o600)
    assert connection.resolve_token(None, str(token)) == "secret"
    monkeypatch.setenv("LOOM_TOKEN_FILE", str(token))
    assert connection.resolve_token(None, None) == "secret"
    assert connection.resolve_token("given", None) == "given"
    empty = tmp_path / "empty"
    empty.write_text("\n")
    os.chmod(empty, 0o600)
    with pytest.raises(loom.FailedPrecondition, match="holds no token"):
        connection.resolve_token(None, str(empty))
    monkeypatch.delenv("LOOM_TOKEN_FILE")
    monkeypatch.setenv("LOOM_TOKEN", "from-env")
    assert connection.resolve_token(None, None) == "from-env"


def test_connection_settings(tmp_path, monkeypatch):
    for var in ("LOOM_SERVER", "LOOM_TLS_CA", "LOOM_TOKEN_FILE", "LOOM_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    c = connection.connect()
    assert c.server == "127.0.0.1:7070" and not c.tls and c.metadata() == []
    monkeypatch.setenv("LOOM_SERVER", "localhost:9")
    c = connection.connect(token="t")
    assert c.server == "localhost:9" and not c.tls
    assert c.metadata() == [("authorization", "Bearer t")]
    assert connection.connect("loomd.example:443").tls  # not loopback: TLS, system roots
    assert not connection.connect("loomd.example:443", insecure=True).tls
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate")
    with pytest.raises(loom.FailedPrecondition, match="not a PEM file"):
        connection.connect(ca=str(ca))
    with pytest.raises(loom.InvalidArgument, match="insecure contradicts"):
        connection.connect(ca=str(ca), insecure=True)
    with pytest.raises(loom.InvalidArgument, match="go together"):
        connection.connect(cert=str(ca))
    with pytest.raises(loom.InvalidArgument) as e:
        connection.connect("no-port")
    assert e.value.field == "server"


def test_unknown_state_name_is_invalid_argument():
    with pytest.raises(loom.InvalidArgument, match="one of QUEUED"):
        loom.client._state_value("DONE")
    assert loom.client._state_value("running") == loom.JobState.Value("RUNNING")
