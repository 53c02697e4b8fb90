//! One time type for both databases: `timestamptz` on Postgres, integer
//! microseconds since the Unix epoch on SQLite (the format the SQLite
//! migrations chose, so comparisons are numeric). Both keep microseconds and
//! drop anything finer; both read back in UTC.

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
use sqlx::sqlite::{SqliteArgumentsBuffer, SqliteTypeInfo, SqliteValueRef};
use sqlx::{Decode, Encode, Postgres, Sqlite, Type};
use time::{OffsetDateTime, UtcOffset};

/// A point in time as a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DbTime(pub OffsetDateTime);

impl DbTime {
    /// Microseconds since the epoch (truncated toward zero, as Postgres does).
    pub fn to_micros(self) -> Result<i64, BoxDynError> {
        Ok(i64::try_from(self.0.unix_timestamp_nanos() / 1_000)?)
    }

    pub fn from_micros(us: i64) -> Result<Self, BoxDynError> {
        Ok(Self(OffsetDateTime::from_unix_timestamp_nanos(
            i128::from(us) * 1_000,
        )?))
    }
}

impl From<OffsetDateTime> for DbTime {
    fn from(t: OffsetDateTime) -> Self {
        Self(t)
    }
}

impl From<DbTime> for OffsetDateTime {
    fn from(t: DbTime) -> Self {
        t.0
    }
}

impl Type<Postgres> for DbTime {
    fn type_info() -> PgTypeInfo {
        <OffsetDateTime as Type<Postgres>>::type_info()
    }
    fn compatible(ty: &PgTypeInfo) -> bool {
        <OffsetDateTime as Type<Postgres>>::compatible(ty)
    }
}

impl Encode<'_, Postgres> for DbTime {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <OffsetDateTime as Encode<Postgres>>::encode_by_ref(&self.0, buf)
    }
}

impl<'r> Decode<'r, Postgres> for DbTime {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        let t = <OffsetDateTime as Decode<Postgres>>::decode(value)?;
        Ok(Self(t.to_offset(UtcOffset::UTC)))
    }
}

impl Type<Sqlite> for DbTime {
    fn type_info() -> SqliteTypeInfo {
        <i64 as Type<Sqlite>>::type_info()
    }
    fn compatible(ty: &SqliteTypeInfo) -> bool {
        <i64 as Type<Sqlite>>::compatible(ty)
    }
}

impl Encode<'_, Sqlite> for DbTime {
    fn encode_by_ref(&self, buf: &mut SqliteArgumentsBuffer) -> Result<IsNull, BoxDynError> {
        <i64 as Encode<Sqlite>>::encode(self.to_micros()?, buf)
    }
}

impl<'r> Decode<'r, Sqlite> for DbTime {
    fn decode(value: SqliteValueRef<'r>) -> Result<Self, BoxDynError> {
        Self::from_micros(<i64 as Decode<Sqlite>>::decode(value)?)
    }
}

/// Shorthand for binding a time.
pub fn db(t: OffsetDateTime) -> DbTime {
    DbTime(t)
}

/// A lease's length as microseconds (saturating), bound into the SQL that
/// adds it to the database's own clock.
pub fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micros_round_trip_and_truncate() {
        let t = time::macros::datetime!(2026-11-29 12:00:00.123456789 +02:00);
        let us = DbTime(t).to_micros().unwrap();
        let back = DbTime::from_micros(us).unwrap().0;
        assert_eq!(
            back,
            time::macros::datetime!(2026-11-29 10:00:00.123456 UTC)
        );
        assert_eq!(back.offset(), UtcOffset::UTC);
    }

    #[test]
    fn out_of_range_is_an_error_not_a_default() {
        assert!(DbTime::from_micros(i64::MAX).is_err());
    }
}
