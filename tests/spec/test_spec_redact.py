"""Secrets of a spec never show: not in error messages, reprs, nor what :func:`redact` gives for display."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from primus_dagster.cli import main
from primus_dagster.spec import (
    REDACTED,
    DeltaSourceSpec,
    SpecError,
    is_secret_key,
    load_job_spec,
    parse_job_spec,
    redact,
    redact_text,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "job.yaml"
TEXT = EXAMPLE.read_text()
SECRET = "hunter2SECRETvalue"


def with_source_keys(lines: str, source: str = "impressions_delta") -> str:
    anchor = (
        "          hour_column: hour\n" if source == "impressions_delta" else "          success_marker: _SUCCESS\n"
    )
    assert anchor in TEXT
    return TEXT.replace(anchor, anchor + lines)


@pytest.mark.parametrize(
    "lines",
    [
        # a type error on a secret value: pydantic would echo it as the input
        f"          storage_options: {{aws_secret_access_key: [{SECRET}]}}\n",
        f"          storage_options: {{aws_secret_access_key: {{a: {SECRET}}}}}\n",
        f"          storage_options: {{AZURE_STORAGE_SAS_TOKEN: 2026-02-30, other: [{SECRET}]}}\n",
        f"          storage_options: {SECRET}\n",
        "          storage_options: {password: 12345}\n",
    ],
)
def test_errors_never_echo_secret_values(lines: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = with_source_keys(lines)
    with pytest.raises(SpecError) as info:
        parse_job_spec(text, "job.yaml")
    message = str(info.value)
    assert "storage_options" in message or "colour" in message
    assert SECRET not in message and "12345" not in message, message
    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 2
    captured = capsys.readouterr()
    assert SECRET not in captured.err + captured.out and "12345" not in captured.err


def test_iceberg_catalog_properties_are_secret(capsys: pytest.CaptureFixture[str]) -> None:
    text = TEXT.replace(
        "          table: synth.impressions",
        f"          table: synth.impressions\n          catalog: {{properties: {{s3.secret-access-key: [{SECRET}]}}}}",
    )
    with pytest.raises(SpecError) as info:
        parse_job_spec(text)
    assert "catalog.properties" in str(info.value) and SECRET not in str(info.value)


def test_syntax_error_does_not_quote_the_line() -> None:
    text = with_source_keys(f'          storage_options: {{token: "{SECRET}}}\n')
    with pytest.raises(SpecError) as info:
        parse_job_spec(text)
    assert SECRET not in str(info.value)


def test_pydantic_errors_of_the_models_hide_inputs() -> None:
    with pytest.raises(ValidationError) as info:
        DeltaSourceSpec.model_validate(
            {
                "name": "d",
                "type": "delta",
                "uri": "u",
                "columns": {"ts": "t", "dense": ["a"]},
                "storage_options": {"key": [SECRET]},
            }
        )
    assert SECRET not in str(info.value)


def test_repr_masks_secrets() -> None:
    text = with_source_keys(
        f"          storage_options: {{aws_secret_access_key: {SECRET}, region: eu-west-1}}\n"
    ).replace(
        "  experiment: ctr-demo", f"  experiment: ctr-demo\n  tracking_uri: https://bob:{SECRET}@mlflow.example.com"
    )
    job = parse_job_spec(text)
    source = job.dataset.source("impressions_delta")
    assert source.storage_options["aws_secret_access_key"] == SECRET  # the real value still reaches the clients
    for shown in (repr(job), str(job), repr(source), repr(job.tracking)):
        assert SECRET not in shown
    assert "storage_options={'aws_secret_access_key': '***', 'region': '***'}" in repr(source)
    assert "https://bob:***@mlflow.example.com" in repr(job.tracking)


def test_redact_for_display() -> None:
    job = load_job_spec(EXAMPLE)
    source = job.dataset.source("impressions_delta").model_copy(
        update={"storage_options": {"aws_secret_access_key": SECRET, "AWS_REGION": "eu-west-1"}}
    )
    shown = redact(source)
    assert shown["storage_options"] == {"aws_secret_access_key": REDACTED, "AWS_REGION": REDACTED}
    assert shown["uri"] == source.uri and shown["columns"]["dense"][0] == "d0"
    nested = {
        "params": {
            "sasl.password": SECRET,
            "sasl_mechanism": "PLAIN",
            "apiKey": SECRET,
            "ssl_keyfile_password": SECRET,
        },
        "items": [{"token": SECRET}, {"name": "x"}],
        "uri": f"postgresql://me:{SECRET}@db/catalog",
    }
    shown = redact(nested)
    assert SECRET not in repr(shown)
    assert shown["items"][1] == {"name": "x"} and shown["uri"] == "postgresql://me:***@db/catalog"
    assert nested["items"][0]["token"] == SECRET  # a copy


@pytest.mark.parametrize(
    "key,secret",
    [
        ("aws_secret_access_key", True),
        ("AWS_ACCESS_KEY_ID", True),
        ("sasl.password", True),
        ("sasl_plain_password", True),
        ("ssl_password", True),
        ("apiKey", True),
        ("apikey", True),
        ("token", True),
        ("client_secret", True),
        ("gcp_credentials", True),
        ("storage_options", True),
        ("properties", True),
        ("name", False),
        ("uri", False),
        ("monkey", False),
        ("hash_buckets", False),
        ("sasl_mechanism", True),
    ],
)
def test_is_secret_key(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_redact_text() -> None:
    assert redact_text("s3://bucket/x") == "s3://bucket/x"
    assert redact_text("see http://u:p@h:1/x and https://v:q@g") == "see http://u:***@h:1/x and https://v:***@g"
    assert (
        redact_text("https://acct.blob.core.windows.net/c/x?sv=2020&sig=abc%2Fdef&se=1")
        == "https://acct.blob.core.windows.net/c/x?sv=2020&sig=***&se=1"
    )
    assert redact_text("s3://b/k?X-Amz-Signature=ff&X-Amz-Date=1") == "s3://b/k?X-Amz-Signature=***&X-Amz-Date=1"
