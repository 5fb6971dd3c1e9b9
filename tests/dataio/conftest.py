import pathlib
import sys

# The suite imports in importlib mode, which adds nothing to sys.path: make the
# shared helpers (tests/jobs_support.py, tests/virtual_time.py) importable.
_TESTS = str(pathlib.Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from collections.abc import Iterator  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from virtual_time import (  # noqa: E402, F401 - fixtures, used by name
    _capture_job_logs,
    _clean_retry_classes,
    _virtual_time_only,
)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """An S3 for the session: moto's server mode on 127.0.0.1, a random port."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_store(s3_endpoint: str, request: pytest.FixtureRequest) -> Any:
    """A fresh bucket on the session's S3, as an obstore ``S3Store``."""
    import boto3
    from obstore.store import S3Store

    bucket = "b-" + str(abs(hash(request.node.nodeid)))[:12]
    creds = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1", **creds).create_bucket(
        Bucket=bucket
    )
    return S3Store(
        bucket,
        endpoint=s3_endpoint,
        region="us-east-1",
        access_key_id="test",
        secret_access_key="test",
        client_options={"allow_http": True},
    )
