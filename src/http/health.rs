//! Liveness and readiness.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use super::SharedState;
use crate::error::ApiError;

pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

/// The process is up.
async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// The database answers and takes writes; otherwise 503. Says which role
/// (and, on Postgres, which host) it sees, and lists the providers in order
/// with their circuits: an open circuit does not make the instance unready
/// (the next provider takes its messages).
async fn readyz(State(state): State<SharedState>) -> Result<Json<Value>, ApiError> {
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
