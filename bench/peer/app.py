"""The pattern tutorials teach for idempotent sends: FastAPI, and Redis
`SET NX` on the idempotency key. In memory, no durability (Redis runs with
persistence off), no provider call: the message is "sent" by returning.
The benchmark's comparison peer (scripts/bench.sh runs it under uvicorn
with 2 workers); it answers the load generator's requests like sendonce.
"""

import json
import os
import uuid

import redis.asyncio as redis
from fastapi import FastAPI, Header, Request, Response

app = FastAPI()
store = redis.Redis(
    host="127.0.0.1", port=int(os.environ.get("PEER_REDIS_PORT", "6379"))
)
API_KEY = os.environ.get("PEER_API_KEY", "")
TTL = 24 * 3600


@app.post("/messages")
async def send(
    request: Request,
    idempotency_key: str = Header(...),
    authorization: str = Header(""),
):
    if authorization != f"Bearer {API_KEY}":
        return Response(status_code=401)
    body = await request.json()
    key = f"idem:{idempotency_key}"
    # The whole idempotency story of the tutorial: first writer wins.
    if not await store.set(key, b"processing", nx=True, ex=TTL):
        stored = await store.get(key)
        if stored is None or stored == b"processing":
            return Response(status_code=409)
        return Response(
            content=stored,
            status_code=201,
            media_type="application/json",
            headers={"Idempotent-Replayed": "true"},
        )
    message = {
        "id": f"msg_{uuid.uuid4()}",
        "idempotency_key": idempotency_key,
        "status": "sent",
        "to": body["to"],
        "body": body["body"],
        "provider_message_id": f"sim_{uuid.uuid4()}",
    }
    out = json.dumps(message, separators=(",", ":")).encode()
    await store.set(key, out, ex=TTL)
    return Response(content=out, status_code=201, media_type="application/json")


@app.get("/readyz")
async def ready():
    await store.ping()
    return {"status": "ok"}
