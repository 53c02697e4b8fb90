//! A database of the run's own on the admin server, dropped at the end.

use sqlx::PgConnection;

/// A database created for one run.
pub struct Database {
    pub name: String,
    pub url: String,
}

/// Creates `sendonce_{prefix}_{uuid}` on the server of `admin_url`.
pub async fn create_database(
    admin: &mut PgConnection,
    admin_url: &str,
    prefix: &str,
) -> Result<Database, String> {
    let name = format!("sendonce_{prefix}_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut *admin)
        .await
        .map_err(|e| format!("create database: {e}"))?;
    let mut url = reqwest::Url::parse(admin_url).map_err(|e| e.to_string())?;
    url.set_path(&name);
    Ok(Database {
        name,
        url: url.to_string(),
    })
}

/// Drops the run's database (best effort: the run's outcome stands).
pub async fn drop_database(admin: &mut PgConnection, db: &Database) {
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
        db.name
    )))
    .execute(&mut *admin)
    .await;
}

/// Messages still `processing` (-1 if the count fails).
pub async fn count_processing(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM messages WHERE status = 'processing'")
        .fetch_one(conn)
        .await
        .unwrap_or(-1)
}
