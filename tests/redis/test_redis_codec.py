"""The encodings scripts key rows by: written the fast way, read as the plain definition says."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ultimat3.jobs.core.jsonvalue import json_text
from ultimat3.jobs.redis.codec import live_key


@given(name=st.text(), tenant=st.none() | st.text(), key=st.text())
def test_a_live_key_is_the_json_text_of_name_tenant_and_key(
    name: str, tenant: str | None, key: str
) -> None:
    """Rows enqueued by an earlier release hold their live keys in this form: a key spelled
    any other way would let a second live row in beside them."""
    assert live_key(name, tenant, key) == json_text([name, tenant or "", key])
