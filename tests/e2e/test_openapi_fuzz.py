"""Schemathesis against the running product: requests generated from the OpenAPI document that
`/v1` serves, valid and invalid, must never get a 500 nor a response the document does not allow.

The document is generated from the protocol's models, so a new endpoint or field is fuzzed here
without anyone extending this file.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.e2e.conftest import running_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack():
    # A pure token source with room for many calls: the point is the shapes, not the refusals.
    yield from running_stack(
        SIMULATED_DECODE_BASE_S="0",
        SIMULATED_PREFILL_S_PER_TOKEN="0",
        SIMULATED_OUTPUT_TOKENS="5",
        RATE_LIMIT_NORMAL_CAPACITY="1000",
        RATE_LIMIT_NORMAL_REFILL_PER_S="100",
        RATE_LIMIT_BATCH_CAPACITY="1000",
    )


@pytest.fixture(scope="module")
def api_key(stack) -> str:
    return stack.create_api_key("alice")


def test_the_api_answers_every_generated_request_as_its_document_says(stack, api_key):
    # Each operation of the served document in turn (Schemathesis' own pytest plugin does not
    # run on this pytest).
    schema = schemathesis.openapi.from_url(f"{stack.base_url}/v1/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 6
    for operation in operations:

        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
        @given(case=st.one_of([operation.as_strategy(mode) for mode in schemathesis.GenerationMode]))
        def answers_as_documented(case: schemathesis.Case) -> None:
            headers = {"Authorization": f"Bearer {api_key}"}
            # A request the document allows may still be refused with a 400 for what a schema
            # cannot say (a prompt longer than the context): only shapes and 5xx are checked.
            case.call_and_validate(
                base_url=stack.base_url,
                headers=headers,
                timeout=30,
                excluded_checks=[positive_data_acceptance],
            )

        answers_as_documented()
