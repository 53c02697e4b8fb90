//! Tenant rows, and the one column type the dialects store differently: a
//! list of strings (`text[]` on Postgres; comma-separated text on SQLite,
//! which has no arrays).

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
use sqlx::sqlite::{SqliteArgumentsBuffer, SqliteTypeInfo, SqliteValueRef};
use sqlx::{Decode, Encode, Postgres, Sqlite, Type};
use uuid::Uuid;

use crate::domain::quiet::QuietHours;
use crate::store::{TenantAuth, TenantSettings};

/// A list of strings as a column (see the module's docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct StringList(pub Vec<String>);

impl Type<Postgres> for StringList {
    fn type_info() -> PgTypeInfo {
        <Vec<String> as Type<Postgres>>::type_info()
    }
    fn compatible(ty: &PgTypeInfo) -> bool {
        <Vec<String> as Type<Postgres>>::compatible(ty)
    }
}

impl Encode<'_, Postgres> for StringList {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <Vec<String> as Encode<Postgres>>::encode_by_ref(&self.0, buf)
    }
}

impl<'r> Decode<'r, Postgres> for StringList {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        Ok(Self(<Vec<String> as Decode<Postgres>>::decode(value)?))
    }
}

impl Type<Sqlite> for StringList {
    fn type_info() -> SqliteTypeInfo {
        <str as Type<Sqlite>>::type_info()
    }
    fn compatible(ty: &SqliteTypeInfo) -> bool {
        <str as Type<Sqlite>>::compatible(ty)
    }
}

impl Encode<'_, Sqlite> for StringList {
    fn encode_by_ref(&self, buf: &mut SqliteArgumentsBuffer) -> Result<IsNull, BoxDynError> {
        <String as Encode<Sqlite>>::encode(self.0.join(","), buf)
    }
}

impl<'r> Decode<'r, Sqlite> for StringList {
    fn decode(value: SqliteValueRef<'r>) -> Result<Self, BoxDynError> {
        let s = <&str as Decode<Sqlite>>::decode(value)?;
        // Empty: no entries (an empty list is not a list of one "").
        Ok(Self(
            s.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
        ))
    }
}

/// A tenant with its settings.
#[derive(sqlx::FromRow)]
pub(crate) struct TenantSettingsRow {
    id: Uuid,
    name: String,
    created_at: crate::store::time::DbTime,
    allowed_countries: Option<StringList>,
    allowed_senders: Option<StringList>,
    quiet_hours: Option<String>,
    home_country: Option<String>,
    disabled: bool,
    verify_channels: Option<String>,
    spend_cap_daily_micros: Option<i64>,
    spend_cap_monthly_micros: Option<i64>,
    spend_cap_international_daily: Option<i64>,
}

impl From<TenantSettingsRow> for TenantSettings {
    fn from(r: TenantSettingsRow) -> Self {
        TenantSettings {
            id: r.id,
            name: r.name,
            created_at: r.created_at.0,
            allowed_countries: r.allowed_countries.map(|l| l.0),
            allowed_senders: r.allowed_senders.map(|l| l.0),
            quiet_hours: r.quiet_hours.as_deref().and_then(QuietHours::parse),
            home_country: r.home_country,
            disabled: r.disabled,
            verify_channels: stored_channels(r.verify_channels.as_deref()),
            spend_caps: crate::spend::SpendCaps {
                daily: r.spend_cap_daily_micros,
                monthly: r.spend_cap_monthly_micros,
                international_daily_messages: r.spend_cap_international_daily,
            },
        }
    }
}

/// What a request learns from its key: the tenant and its settings.
#[derive(sqlx::FromRow)]
pub(crate) struct TenantAuthRow {
    tenant_id: Uuid,
    allowed_countries: Option<StringList>,
    allowed_senders: Option<StringList>,
    bootstrap_tenant: bool,
    quiet_hours: Option<String>,
    key_id: Uuid,
    label: Option<String>,
    scopes: String,
    disabled: bool,
    home_country: Option<String>,
    verify_channels: Option<String>,
    spend_cap_daily_micros: Option<i64>,
    spend_cap_monthly_micros: Option<i64>,
    spend_cap_international_daily: Option<i64>,
    live_tenant_id: Option<Uuid>,
}

impl From<TenantAuthRow> for TenantAuth {
    fn from(r: TenantAuthRow) -> Self {
        TenantAuth {
            id: r.tenant_id,
            key_id: r.key_id,
            key_label: r.label,
            scopes: crate::scopes::Scopes::from_stored(&r.scopes),
            disabled: r.disabled,
            allowed_countries: r.allowed_countries.map(|l| l.0),
            allowed_senders: r.allowed_senders.map(|l| l.0),
            bootstrap_tenant: r.bootstrap_tenant,
            quiet_hours: r.quiet_hours.as_deref().and_then(QuietHours::parse),
            home_country: r.home_country,
            verify_channels: stored_channels(r.verify_channels.as_deref()),
            spend_caps: crate::spend::SpendCaps {
                daily: r.spend_cap_daily_micros,
                monthly: r.spend_cap_monthly_micros,
                international_daily_messages: r.spend_cap_international_daily,
            },
            live_id: r.live_tenant_id,
        }
    }
}

/// A tenant's stored default channels; one naming a channel the registry no
/// longer has reads as none (`sms`), so that its keys keep working.
fn stored_channels(s: Option<&str>) -> Option<crate::domain::Channels> {
    crate::domain::Channels::parse_stored(s?, &crate::provider::registry::verify_channels())
}
