"""Collects the code blocks of README.md and docs/*.md as tests (tests/markdown_docs.py)."""

from __future__ import annotations

import pytest

from tests import fixtures_s3, markdown_docs

pytest_collect_file = markdown_docs.sybil_collector()


@pytest.fixture(scope="session")
def docs_s3():
    """One moto S3 server for every guide (about a second to start)."""
    yield from fixtures_s3.moto_options()


@pytest.fixture(scope="module")
def docs_workspace(request, tmp_path_factory, docs_s3):
    """A guide's working directory with its data; the S3 examples' environment set."""
    guide = request.path.name
    directory = tmp_path_factory.mktemp(guide.replace(".", "-"))
    markdown_docs.make_workspace(directory, guide)
    markdown_docs.upload_to_s3(docs_s3, directory)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in markdown_docs.s3_environment(docs_s3).items():
            patch.setenv(name, value)
        patch.chdir(directory)
        yield directory
