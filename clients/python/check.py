"""What an integrator's generated client does against a live sendonce.

Run by scripts/client-check.sh, which generates `sendonce_client`
(openapi-python-client) and `sendonce_models` (datamodel-code-generator)
from openapi.yaml into $CLIENT_GEN_DIR, starts the server with the mock
provider and sets:

  SENDONCE_URL   the server's base URL
  SENDONCE_KEY   a valid API key of its tenant
  MOCK_URL       the mock provider (GET /stats counts what it delivered)

Each step is a function in STEPS, run in order; a step may leave what later
ones need in `ctx.state`. Every answer is read through the generated client
(`response.parsed`), and must be the generated model the description
promises: a response the generator dropped would come back as `None`.
To check a new operation, write a step and add it to STEPS.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import os
import re
import sys
import time
import traceback
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, os.environ["CLIENT_GEN_DIR"])

import sendonce_models as dm  # noqa: E402
from sendonce_client import AuthenticatedClient  # noqa: E402
from sendonce_client.api.messages import create_message, get_message  # noqa: E402
from sendonce_client.api.opt_outs import (  # noqa: E402
    add_opt_out,
    list_opt_outs,
    remove_opt_out,
)
from sendonce_client.api.webhooks import (  # noqa: E402
    create_webhook_endpoint,
    delete_webhook_endpoint,
    get_webhook_endpoint,
    list_webhook_endpoints,
    list_webhook_events,
    rotate_webhook_secret,
)
from sendonce_client.models import (  # noqa: E402
    AddOptOutBody,
    CreatedWebhookEndpoint,
    CreateWebhookEndpoint,
    FieldError,
    Message,
    MessageErrorCode,
    MessageStatus,
    OptOutList,
    OptOutResult,
    OptOutSource,
    Problem,
    SendRequest,
    ValidationProblem,
    WebhookEndpoint,
    WebhookEndpointList,
    WebhookEventFeed,
    WebhookEventType,
)

PROBLEM = "urn:sendonce:problem:"


@dataclass
class Ctx:
    base_url: str
    api_key: str
    client: AuthenticatedClient
    bad_client: AuthenticatedClient
    mock_url: str
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    state: dict[str, Any] = field(default_factory=dict)

    def key(self, name: str) -> str:
        """An idempotency key unique to this run."""
        return f"CLIENT-CHECK-{self.run}-{name}"


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def expect_problem(resp: Any, status: int, slug: str) -> Problem | ValidationProblem:
    """The answer is `status`, parsed into a generated problem model (a
    `ValidationProblem` for `validation`, a `Problem` for the others)."""
    expect(resp.status_code == status, f"status {resp.status_code}, want {status}: {resp.content!r}")
    p = resp.parsed
    expect(p is not None, f"the {status} answer was not parsed")
    want = ValidationProblem if slug == "validation" else Problem
    expect(isinstance(p, want), f"the {status} answer parsed as {type(p).__name__}, not {want.__name__}")
    expect(p.type_ == PROBLEM + slug, f"problem type {p.type_!r}, want {PROBLEM + slug!r}")
    expect(p.status == status, f"problem status {p.status}, want {status}")
    expect(bool(p.title) and bool(p.detail), "problem without title or detail")
    return p


def header(resp: Any, name: str) -> str | None:
    return resp.headers.get(name)


def mock_stats(ctx: Ctx) -> dict[str, Any]:
    with urllib.request.urlopen(f"{ctx.mock_url}/stats", timeout=10) as r:
        return json.load(r)


# --- steps -----------------------------------------------------------------


def generated_every_operation_and_response(ctx: Ctx) -> None:
    """openapi-python-client made one function for every operation (found by
    its method and path, whatever the module is called), and its parser
    handles every documented status code that has a body."""
    spec = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    api = Path(os.environ["CLIENT_GEN_DIR"]) / "sendonce_client" / "api"
    generated: dict[tuple[str, str], str] = {}
    for path in api.glob("*/*.py"):
        if path.name == "__init__.py":
            continue
        found = re.search(r'"method": "(\w+)",\s*"url": "([^"]+)"', path.read_text())
        expect(found is not None, f"{path}: no method and url in the generated module")
        module = "sendonce_client.api." + ".".join(path.relative_to(api).with_suffix("").parts)
        generated[(found.group(1), found.group(2))] = module
    ops = 0
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method not in ("get", "put", "post", "delete", "patch", "head", "options", "trace"):
                continue
            ops += 1
            module = generated.get((method, path))
            expect(module is not None, f"{method.upper()} {path} ({op['operationId']}): not generated")
            mod = importlib.import_module(module)
            parser = inspect.getsource(mod._parse_response)
            for code, resp in op["responses"].items():
                if "$ref" in resp:
                    resp = spec["components"]["responses"][resp["$ref"].rsplit("/", 1)[1]]
                if not resp.get("content"):
                    continue
                expect(
                    f"response.status_code == {code}" in parser,
                    f"{method.upper()} {path}: the generated client does not parse {code}",
                )
    expect(len(generated) == ops, f"{len(generated)} generated operations, {ops} in openapi.yaml")


def generated_models_are_sound(ctx: Ctx) -> None:
    """datamodel-code-generator's models: no enum with a None member or a
    duplicate value, one message model and one status enum."""
    for name, obj in vars(dm).items():
        if isinstance(obj, type) and issubclass(obj, enum.Enum) and obj.__module__ == dm.__name__:
            values = [m.value for m in obj]
            expect(None not in values, f"enum {name} has a None member")
            expect(len(values) == len(set(values)), f"enum {name} repeats a value: {values}")
    # One message model and one status enum for every answer (201, 202,
    # GET): the HTTP status says which kind it is.
    for name in ("FinalMessage", "ProcessingMessage", "FinalMessageStatus", "ProcessingMessageStatus"):
        expect(not hasattr(dm, name), f"a second message model or status enum: {name}")
    expect(not any("Type0" in name for name in vars(dm)), "a generated name with Type0")
    for example in ("MessageProcessing", "MessageSent"):
        dm.Message.model_validate(spec_example(example))
    # A problem type this version does not know still parses (open string).
    future = {"type": PROBLEM + "some-future-slug", "title": "T", "status": 418, "detail": "d"}
    expect(dm.Problem.model_validate(future).type == future["type"], "Problem type is not open")
    expect(Problem.from_dict(future).type_ == future["type"], "Problem type is not open")


def spec_example(name: str) -> dict[str, Any]:
    spec = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    return spec["components"]["examples"][name]["value"]


def send(ctx: Ctx) -> None:
    key = ctx.key("SEND")
    req = SendRequest(to="+14155550100", body="Your order 92831 is confirmed.")
    resp = create_message.sync_detailed(client=ctx.client, body=req, idempotency_key=key)
    expect(resp.status_code == 201, f"send: {resp.status_code} {resp.content!r}")
    m = resp.parsed
    expect(m is not None, "the 201 was not parsed")
    expect(isinstance(m, Message), f"the 201 parsed as {type(m).__name__}")
    expect(m.status == MessageStatus.SENT, f"status {m.status}")
    expect(m.idempotency_key == key, f"idempotency_key {m.idempotency_key}")
    expect(m.to == "+14155550100" and m.body == req.body, "to/body differ from the request")
    expect(m.id.startswith("msg_") and m.attempts == 1 and m.error is None, f"message {m}")
    expect(header(resp, "location") == f"/messages/{key}", f"Location {header(resp, 'location')}")
    expect(header(resp, "idempotent-replayed") is None, "a first answer marked replayed")
    dm.Message.model_validate_json(resp.content)
    ctx.state["send"] = (key, req, m, resp.content)


def replay(ctx: Ctx) -> None:
    key, req, first, content = ctx.state["send"]
    resp = create_message.sync_detailed(client=ctx.client, body=req, idempotency_key=key)
    expect(resp.status_code == 201, f"replay: {resp.status_code}")
    m = resp.parsed
    expect(isinstance(m, Message), f"the replay parsed as {type(m).__name__}")
    expect(m.id == first.id, f"replay id {m.id}, first {first.id}")
    expect(header(resp, "idempotent-replayed") == "true", "replay not marked Idempotent-Replayed")
    expect(resp.content == content, "the replay's bytes differ from the first answer's")


def respond_async_202(ctx: Ctx) -> None:
    key = ctx.key("ASYNC")
    req = SendRequest(to="+14155550101", body="Your order 92832 is confirmed.")
    resp = create_message.sync_detailed(
        client=ctx.client, body=req, idempotency_key=key, prefer="respond-async"
    )
    expect(resp.status_code == 202, f"respond-async: {resp.status_code} {resp.content!r}")
    m = resp.parsed
    expect(m is not None, "the 202 was not parsed")
    expect(isinstance(m, Message), f"the 202 parsed as {type(m).__name__}")
    expect(m.status == MessageStatus.PROCESSING, f"status {m.status}")
    expect(header(resp, "location") == f"/messages/{key}", "202 without its Location")
    dm.Message.model_validate_json(resp.content)
    ctx.state["async"] = (key, req, m)


def in_use_409(ctx: Ctx) -> None:
    key, req, _ = ctx.state["async"]
    resp = create_message.sync_detailed(
        client=ctx.client, body=req, idempotency_key=key, prefer="respond-async"
    )
    expect_problem(resp, 409, "idempotency-key-in-use")
    expect(int(header(resp, "retry-after") or "0") >= 1, "409 without Retry-After")


def reused_422(ctx: Ctx) -> None:
    key, _, _, _ = ctx.state["send"]
    other = SendRequest(to="+14155550199", body="Your order 92831 is confirmed.")
    resp = create_message.sync_detailed(client=ctx.client, body=other, idempotency_key=key)
    expect_problem(resp, 422, "idempotency-key-reused")


def validation_400(ctx: Ctx) -> None:
    key = ctx.key("INVALID")
    bad = SendRequest(to="12345", body="")
    resp = create_message.sync_detailed(client=ctx.client, body=bad, idempotency_key=key)
    p = expect_problem(resp, 400, "validation")
    expect(all(isinstance(e, FieldError) for e in p.errors), "errors[] are not FieldError")
    fields = [e.field for e in p.errors]
    expect(fields == ["body", "to"], f"errors on {fields}, want body and to")
    expect(all(e.message for e in p.errors), "an error without a message")
    parsed = dm.ValidationProblem.model_validate_json(resp.content)
    expect([e.field for e in parsed.errors] == fields, "pydantic model disagrees on errors[]")
    # A rejected request stores nothing.
    got = get_message.sync_detailed(key, client=ctx.client)
    expect_problem(got, 404, "not-found")


def invalid_key_400(ctx: Ctx) -> None:
    req = SendRequest(to="+14155550100", body="hello")
    resp = create_message.sync_detailed(client=ctx.client, body=req, idempotency_key="has space")
    expect_problem(resp, 400, "invalid-idempotency-key")


def unauthorized_401(ctx: Ctx) -> None:
    req = SendRequest(to="+14155550100", body="hello")
    resp = create_message.sync_detailed(client=ctx.bad_client, body=req, idempotency_key=ctx.key("401"))
    expect_problem(resp, 401, "unauthorized")
    expect(header(resp, "www-authenticate") == "Bearer", "401 without WWW-Authenticate: Bearer")
    expect_problem(list_opt_outs.sync_detailed(client=ctx.bad_client), 401, "unauthorized")


def async_send_finishes_and_replays(ctx: Ctx) -> None:
    key, req, first = ctx.state["async"]
    deadline = time.monotonic() + 30
    while True:
        got = get_message.sync_detailed(key, client=ctx.client)
        expect(got.status_code == 200 and isinstance(got.parsed, Message), f"GET: {got.status_code}")
        if got.parsed.status != MessageStatus.PROCESSING:
            break
        expect(time.monotonic() < deadline, "the async send is still processing after 30 s")
        time.sleep(0.2)
    expect(got.parsed.status == MessageStatus.SENT, f"async send ended {got.parsed.status}")
    resp = create_message.sync_detailed(client=ctx.client, body=req, idempotency_key=key)
    expect(resp.status_code == 201 and isinstance(resp.parsed, Message), f"retry: {resp.status_code}")
    expect(resp.parsed.id == first.id, "the retry names another message")
    expect(header(resp, "idempotent-replayed") == "true", "retry after the end not replayed")


def opt_outs(ctx: Ctx) -> None:
    number = "+14155550142"
    added = add_opt_out.sync_detailed(client=ctx.client, body=AddOptOutBody(number=number))
    expect(added.status_code == 201, f"add: {added.status_code} {added.content!r}")
    expect(isinstance(added.parsed, OptOutResult), f"add parsed as {type(added.parsed).__name__}")
    expect(added.parsed.number == number and added.parsed.opted_out is True, f"{added.parsed}")
    again = add_opt_out.sync_detailed(client=ctx.client, body=AddOptOutBody(number=number))
    expect(again.status_code == 200 and isinstance(again.parsed, OptOutResult), "add twice")

    listed = list_opt_outs.sync_detailed(client=ctx.client)
    expect(listed.status_code == 200 and isinstance(listed.parsed, OptOutList), "list")
    mine = [o for o in listed.parsed.data if o.number == number]
    expect(len(mine) == 1 and mine[0].source == OptOutSource.API, f"listed: {listed.parsed}")

    # A send to it ends failed, recipient_opted_out, without the provider.
    resp = create_message.sync_detailed(
        client=ctx.client,
        body=SendRequest(to=number, body="You will not get this."),
        idempotency_key=ctx.key("OPTED-OUT"),
    )
    expect(resp.status_code == 201 and isinstance(resp.parsed, Message), f"{resp.status_code}")
    m = resp.parsed
    expect(m.status == MessageStatus.FAILED, f"opted-out send ended {m.status}")
    expect(m.error is not None and m.error.code == MessageErrorCode.RECIPIENT_OPTED_OUT, f"{m.error}")

    removed = remove_opt_out.sync_detailed(number, client=ctx.client)
    expect(removed.status_code == 204, f"remove: {removed.status_code}")
    expect_problem(remove_opt_out.sync_detailed(number, client=ctx.client), 404, "not-found")
    after = list_opt_outs.sync_detailed(client=ctx.client)
    expect(isinstance(after.parsed, OptOutList), "list after remove")
    expect(all(o.number != number for o in after.parsed.data), "still listed after remove")


# The documents whose `client-check` blocks are run: the README, and the
# integration guide the client examples live in.
CHECKED_DOCS = (ROOT / "README.md", ROOT / "docs" / "integrating.md")


def readme_block(marker: str) -> str:
    """The fenced block following `<!-- client-check: MARKER -->` in the first
    of CHECKED_DOCS that has that marker."""
    line = f"<!-- client-check: {marker} -->"
    docs = [doc.read_text().splitlines() for doc in CHECKED_DOCS if doc.exists()]
    found = [lines for lines in docs if line in lines]
    expect(bool(found), f"no {line} in {', '.join(str(d.relative_to(ROOT)) for d in CHECKED_DOCS)}")
    lines = found[0]
    start = lines.index(line)
    expect(lines[start + 1].startswith("```"), f"no fenced block after the {marker} marker")
    end = lines.index("```", start + 2)
    return "\n".join(lines[start + 2 : end]) + "\n"


def readme_client_snippet(ctx: Ctx) -> None:
    """The README's client example runs as written (against this server)."""
    code = readme_block("client")
    default_url = 'base_url="http://127.0.0.1:8080"'
    expect(default_url in code, "the README example no longer names the default URL")
    code = code.replace(default_url, f"base_url={ctx.base_url!r}")
    scope: dict[str, Any] = {"KEY": ctx.api_key}
    exec(compile(code, "README.md (client-check: client)", "exec"), scope)
    resp = scope["resp"]
    expect(resp.status_code == 201, f"README example: {resp.status_code} {resp.content!r}")
    expect(isinstance(scope["replayed"], bool), "the example reads Idempotent-Replayed")
    expect(scope["retry_after"] is None, "a 201 carries no Retry-After")
    expect(isinstance(resp.parsed, Message), f"README example parsed {type(resp.parsed).__name__}")
    expect(resp.parsed.status == MessageStatus.SENT, f"README example: {resp.parsed.status}")


def readme_webhook_verifier(ctx: Ctx) -> None:
    """The README's signature check agrees with the Standard Webhooks
    specification's published test vector, and refuses what it must."""
    scope: dict[str, Any] = {}
    exec(compile(readme_block("verify-webhook"), "README.md (verify-webhook)", "exec"), scope)
    verify = scope["verify_webhook"]
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    good = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    h = {"webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek", "webhook-timestamp": "1614265330"}
    now = 1614265330 + 10
    expect(verify(secret, {**h, "webhook-signature": good}, body, now=now), "the test vector fails")
    rotated = {**h, "webhook-signature": "v1,bm90IHRoaXMgb25l " + good}
    expect(verify(secret, rotated, body, now=now), "the second of two signatures is not tried")
    expect(
        not verify(secret, {**h, "webhook-signature": good}, body + b" ", now=now), "a changed body passes"
    )
    other = "whsec_" + "A" * 32
    expect(not verify(other, {**h, "webhook-signature": good}, body, now=now), "another secret passes")
    expect(not verify(secret, {**h, "webhook-signature": good}, body, now=now + 3600), "an old one passes")
    expect(not verify(secret, {**h, "webhook-signature": good[3:]}, body, now=now), "no v1, prefix passes")


def one_sms_per_send(ctx: Ctx) -> None:
    """The provider got each of the three real sends (send, the async one,
    the README's) once: no replay, 409 or refusal reached it."""
    stats = mock_stats(ctx)
    expect(stats["keys_delivered"] == 3, f"provider stats {stats}")
    expect(stats["deliveries"] == 3 and stats["duplicate_keys"] == 0, f"provider stats {stats}")


def webhook_endpoints(ctx: Ctx) -> None:
    """Create, list, read, rotate and delete an endpoint; a private target
    is a 400 on `url` (the server runs without SENDONCE_WEBHOOK_ALLOW_PRIVATE)."""
    private = create_webhook_endpoint.sync_detailed(
        client=ctx.client, body=CreateWebhookEndpoint(url="https://127.0.0.1/hook")
    )
    problem = expect_problem(private, 400, "validation")
    expect(isinstance(problem, ValidationProblem), f"the 400 parsed as {type(problem).__name__}")
    expect([e.field for e in problem.errors] == ["url"], f"errors {problem.errors}")

    # A public address as a literal: nothing to resolve, nothing delivered in
    # this run (its events fire for no later send of this check).
    body = CreateWebhookEndpoint(
        url="https://93.184.215.14/sendonce", events=[WebhookEventType.MESSAGE_DELIVERED]
    )
    resp = create_webhook_endpoint.sync_detailed(client=ctx.client, body=body)
    expect(resp.status_code == 201, f"create endpoint: {resp.status_code} {resp.content!r}")
    created = resp.parsed
    expect(isinstance(created, CreatedWebhookEndpoint), f"parsed as {type(created).__name__}")
    expect(created.id.startswith("whe_") and created.enabled, f"endpoint {created}")
    expect(created.secret.startswith("whsec_"), "the secret is not whsec_")
    expect(created.events == [WebhookEventType.MESSAGE_DELIVERED], f"events {created.events}")

    listed = list_webhook_endpoints.sync_detailed(client=ctx.client)
    expect(isinstance(listed.parsed, WebhookEndpointList), "the list was not parsed")
    expect(created.id in [e.id for e in listed.parsed.data], "the new endpoint is not listed")
    expect(b"whsec_" not in listed.content, "the list shows a secret")

    one = get_webhook_endpoint.sync_detailed(created.id, client=ctx.client)
    expect(isinstance(one.parsed, WebhookEndpoint), f"get parsed as {type(one.parsed).__name__}")

    rotated = rotate_webhook_secret.sync_detailed(created.id, client=ctx.client)
    expect(isinstance(rotated.parsed, CreatedWebhookEndpoint), "the rotation was not parsed")
    expect(rotated.parsed.secret != created.secret, "rotation kept the secret")
    expect(rotated.parsed.previous_secret_expires_at is not None, "the old secret does not sign on")

    gone = delete_webhook_endpoint.sync_detailed(created.id, client=ctx.client)
    expect(gone.status_code == 204, f"delete: {gone.status_code}")
    again = get_webhook_endpoint.sync_detailed(created.id, client=ctx.client)
    expect_problem(again, 404, "not-found")


def events_feed(ctx: Ctx) -> None:
    """The feed has the sends that finished, in order; a poller goes on from
    `next_cursor`, and from its last event's `cursor` on the last page."""
    wanted = {ctx.state["send"][2].id}
    deadline = time.monotonic() + 30
    cursor: str | None = None
    seen: list[str] = []
    while True:
        kwargs = {"cursor": cursor} if cursor else {}
        resp = list_webhook_events.sync_detailed(client=ctx.client, limit=100, **kwargs)
        feed = resp.parsed
        expect(isinstance(feed, WebhookEventFeed), f"the feed parsed as {type(feed).__name__}")
        seen += [e.data.id for e in feed.data if e.type_ == WebhookEventType.MESSAGE_SENT]
        if isinstance(feed.next_cursor, str):
            cursor = feed.next_cursor
        elif feed.data:
            cursor = feed.data[-1].cursor
        if wanted <= set(seen):
            break
        expect(time.monotonic() < deadline, f"the feed never showed {wanted}: {seen}")
        if not feed.data:
            time.sleep(0.2)
    expect(len(seen) == len(set(seen)), f"an event twice in the feed: {seen}")
    last = list_webhook_events.sync_detailed(client=ctx.client, cursor=cursor, limit=100)
    expect(isinstance(last.parsed, WebhookEventFeed), "the last page was not parsed")


# The order matters: later steps use what earlier ones left in ctx.state.
STEPS: list[Callable[[Ctx], None]] = [
    generated_every_operation_and_response,
    generated_models_are_sound,
    send,
    replay,
    respond_async_202,
    in_use_409,
    reused_422,
    validation_400,
    invalid_key_400,
    unauthorized_401,
    async_send_finishes_and_replays,
    opt_outs,
    readme_client_snippet,
    readme_webhook_verifier,
    webhook_endpoints,
    events_feed,
    one_sms_per_send,
]


def main() -> int:
    base = os.environ["SENDONCE_URL"]
    key = os.environ["SENDONCE_KEY"]
    ctx = Ctx(
        base_url=base,
        api_key=key,
        client=AuthenticatedClient(base_url=base, token=key, timeout=30.0),
        bad_client=AuthenticatedClient(base_url=base, token="so_not-a-real-key", timeout=30.0),
        mock_url=os.environ["MOCK_URL"],
    )
    passed = 0
    for step in STEPS:
        try:
            step(ctx)
        except Exception:
            print(f"client-check: FAIL {step.__name__}", flush=True)
            traceback.print_exc()
            print(f"client-check: {passed} passed, 1 failed")
            return 1
        passed += 1
        print(f"client-check: ok {step.__name__}", flush=True)
    print(f"client-check: {passed} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
