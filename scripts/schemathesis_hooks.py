"""Schemathesis hooks: how to generate values JSON Schema cannot describe.

A phone number is valid only if it fits its country's numbering plan (the
server checks with libphonenumber's metadata); no pattern can say that, so
the `phone` format draws from real, valid numbers in several countries.
Negative tests still mutate them into invalid ones.
"""

import schemathesis
from hypothesis import strategies as st

VALID_NUMBERS = [
    "+14155550100",
    "+14155552671",
    "+16135550123",
    "+442079460958",
    "+447911123456",
    "+4915123456789",
    "+33612345678",
    "+61412345678",
    "+819012345678",
    "+5511912345678",
    "+919812345678",
]

schemathesis.openapi.format("phone", st.sampled_from(VALID_NUMBERS))

# `send_at` may be at most 35 days ahead of the server's clock (400 beyond),
# which no schema can say: request date-times are drawn from a year back
# (a past time means "now") to 30 days ahead.
from datetime import datetime, timedelta, timezone


def _date_time(offset_seconds):
    t = datetime.now(timezone.utc) + timedelta(seconds=offset_seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


schemathesis.openapi.format(
    "date-time", st.integers(-365 * 86400, 30 * 86400).map(_date_time)
)


# A tenant's lists of allowed senders and countries are state: once a
# generated PATCH /admin/tenants/{name} sets one on the run's own tenant,
# every later schema-valid POST /messages naming another sender or country
# is refused with the documented 400 `validation` (openapi.yaml: "A sender
# must be on the tenant's list"), which the acceptance check then reports
# as a schema-valid request rejected. A generated PATCH therefore clears
# those lists instead of setting them (the lists' checks have their own tests
# in tests/api/hardening2.rs, cli.rs and admin.rs); every other field, and a
# list's validation, is still generated.
@schemathesis.hook("map_body").apply_to(operation_id="adminUpdateTenant")
def _patch_keeps_the_tenant_open(context, body):
    if isinstance(body, dict):
        for field in ("senders", "allowed_countries"):
            value = body.get(field)
            if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
                body[field] = None
    return body
