//! Liveness and readiness.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use super::SharedState;
use crate::error::ApiError;

/// The probes; `/readyz` with its details (the database's role and host,
/// the providers' circuits) only if `details`: with a metrics listener of
/// its own those are served there, and the API's listener says only ok or
/// 503 to whoever reaches it.
pub fn router(details: bool) -> Router<SharedState> {
    let probes = Router::new().route("/healthz", get(healthz));
    if details {
        probes.route("/readyz", get(readyz))
    } else {
        probes.route("/readyz", get(ready))
    }
}

/// `/readyz` without details: 200 `{"status":"ok"}` or 503.
async fn ready(State(state): State<SharedState>) -> Result<Json<Value>, ApiError> {
    state.store.status().await?;
    Ok(Json(json!({"status": "ok"})))
}

/// The process is up.
async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// The database answers and takes writes; otherwise 503. Says which role
/// (and, on Postgres, which host) it sees, and lists the providers in order
/// with their circuits: an open circuit does not make the instance unready
/// (the next provider takes its messages).
pub(super) async fn readyz(State(state): State<SharedState>) -> Result<Json<Value>, ApiError> {
    let database = state.store.status().await?;
    let providers: Vec<Value> = state
        .deliverer
        .circuits()
        .await
        .into_iter()
        .map(|c| json!({"name": c.provider, "circuit": c.state.as_str()}))
        .collect();
    Ok(Json(
        json!({"status": "ok", "database": database, "providers": providers}),
    ))
}
