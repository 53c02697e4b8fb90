//! One pagination convention for every list: `?limit=` (1 to the list's
//! maximum) and `?cursor=` (the previous page's `next_cursor`), answered
//! with `{"data": [...], "next_cursor": ...}`, `null` on the last page. Any
//! other query parameter, one given twice, a malformed limit or a cursor
//! this list did not hand out is a 400 `validation` problem naming it
//! (`after`, the feed's and opt-outs' old name, says to use `cursor`).
//!
//! A cursor is opaque: the list's position (a feed position, a receipt or
//! attempt sequence, a number) sealed with the verify secret's keys
//! (authenticated encryption, `verify::crypto::Keys::seal`) and bound to
//! the tenant and the list. Positions that count across tenants (the events
//! feed's transaction id and sequence, receipt and attempt ids) are then
//! unreadable to the client, so two cursors tell nothing about another
//! tenant's volume (issue 29, finding 12), on both stores alike; a cursor
//! of another tenant or another list does not open. The parsing is a pure
//! function ([`parse`]); [`Page`] is the thin part that seals and opens.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use uuid::Uuid;

use super::SharedState;
use crate::domain::FieldError;
use crate::error::ApiError;
use crate::verify::crypto::Keys;

/// What a list was asked for: a page size and the cursor's text, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Asked {
    pub limit: u32,
    pub cursor: Option<String>,
}

/// The longest cursor text accepted (every cursor handed out is shorter).
const CURSOR_MAX: usize = 512;

/// The query string of a list request, read strictly.
pub fn parse(query: Option<&str>, default: u32, max: u32) -> Result<Asked, ApiError> {
    let mut limit: Option<String> = None;
    let mut cursor: Option<String> = None;
    let mut errors = Vec::new();
    for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        let slot = match name.as_ref() {
            "limit" => &mut limit,
            "cursor" => &mut cursor,
            "after" => {
                errors.push(FieldError::new(
                    "after",
                    "is not a parameter: page with `cursor`, the previous page's `next_cursor`",
                ));
                continue;
            }
            other => {
                errors.push(FieldError::new(
                    other,
                    "is not a parameter of this list (it takes `limit` and `cursor`)",
                ));
                continue;
            }
        };
        if slot.is_some() {
            errors.push(FieldError::new(name.as_ref(), "appears more than once"));
        }
        *slot = Some(value.into_owned());
    }
    let limit = match limit.as_deref() {
        None => Some(default),
        Some(l) => l.parse::<u32>().ok().filter(|l| (1..=max).contains(l)),
    };
    if limit.is_none() {
        errors.push(FieldError::new(
            "limit",
            format!("must be a whole number from 1 to {max}"),
        ));
    }
    if cursor
        .as_deref()
        .is_some_and(|c| c.is_empty() || c.len() > CURSOR_MAX)
    {
        errors.push(FieldError::new(
            "cursor",
            "is not a cursor this list returned (next_cursor)",
        ));
    }
    if !errors.is_empty() {
        errors.sort_by(|a, b| a.field.cmp(&b.field));
        errors.dedup();
        return Err(ApiError::Validation(errors));
    }
    Ok(Asked {
        limit: limit.unwrap_or(default),
        cursor,
    })
}

/// A page being answered: the size asked for, where it starts, and what
/// seals the next cursor.
pub struct Page {
    pub limit: u32,
    /// The position the cursor held (opened), `None` from the start.
    pub after: Option<Vec<u8>>,
    keys: Arc<Keys>,
    aad: Vec<u8>,
}

impl Page {
    /// The page `query` asks for of `list` (a name unique among lists).
    pub async fn of(
        state: &SharedState,
        tenant_id: Uuid,
        list: &str,
        query: Option<&str>,
        default: u32,
        max: u32,
    ) -> Result<Self, ApiError> {
        let asked = parse(query, default, max)?;
        let keys = state.verify.secret.keys().await?;
        Self::open(keys, tenant_id, list, asked)
    }

    fn open(keys: Arc<Keys>, tenant_id: Uuid, list: &str, asked: Asked) -> Result<Self, ApiError> {
        let aad = [
            b"sendonce cursor v1:".as_slice(),
            tenant_id.as_bytes(),
            list.as_bytes(),
        ]
        .concat();
        let after = match asked.cursor {
            None => None,
            Some(c) => Some(
                URL_SAFE_NO_PAD
                    .decode(c)
                    .ok()
                    .and_then(|sealed| keys.open(&aad, &sealed).ok())
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "cursor",
                            "is not a cursor this list returned (next_cursor)",
                        )
                    })?,
            ),
        };
        Ok(Self {
            limit: asked.limit,
            after,
            keys,
            aad,
        })
    }

    /// The cursor of `position` in this list.
    pub fn cursor(&self, position: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(self.keys.seal(&self.aad, position))
    }

    /// The opened cursor read by `read`, or the 400 a cursor that opens but
    /// does not read is (another version of this list's cursor).
    pub fn after_as<T>(
        &self,
        read: impl FnOnce(&[u8]) -> Option<T>,
    ) -> Result<Option<T>, ApiError> {
        match &self.after {
            None => Ok(None),
            Some(bytes) => read(bytes).map(Some).ok_or_else(|| {
                ApiError::invalid("cursor", "is not a cursor this list returned (next_cursor)")
            }),
        }
    }

    /// `items` fetched with one more than the limit: the page (at most
    /// `limit`), and the next cursor (`None`: the last page), from the last
    /// item's position.
    pub fn finish<T>(
        &self,
        mut items: Vec<T>,
        position: impl Fn(&T) -> Vec<u8>,
    ) -> (Vec<T>, Option<String>) {
        let limit = usize::try_from(self.limit).unwrap_or(usize::MAX);
        let more = items.len() > limit;
        items.truncate(limit);
        let next = if more {
            items.last().map(|last| self.cursor(&position(last)))
        } else {
            None
        };
        (items, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(e: ApiError) -> Vec<String> {
        match e {
            ApiError::Validation(errors) => errors.into_iter().map(|e| e.field).collect(),
            other => panic!("not a validation problem: {other:?}"),
        }
    }

    #[test]
    fn the_query_is_read_strictly() {
        let ok = |q: Option<&str>| parse(q, 100, 500).expect("accepted");
        assert_eq!(
            ok(None),
            Asked {
                limit: 100,
                cursor: None
            }
        );
        assert_eq!(
            ok(Some("")),
            Asked {
                limit: 100,
                cursor: None
            }
        );
        assert_eq!(
            ok(Some("limit=500&cursor=abc")),
            Asked {
                limit: 500,
                cursor: Some("abc".into())
            }
        );
        for (q, want) in [
            ("limit=0", vec!["limit"]),
            ("limit=501", vec!["limit"]),
            ("limit=-1", vec!["limit"]),
            ("limit=1.5", vec!["limit"]),
            ("limit=", vec!["limit"]),
            ("limit=1&limit=2", vec!["limit"]),
            ("cursor=", vec!["cursor"]),
            ("cursor=a&cursor=b", vec!["cursor"]),
            ("after=0-12", vec!["after"]),
            ("cursor=x&Limit=2", vec!["Limit"]),
            ("page=2&offset=3", vec!["offset", "page"]),
        ] {
            assert_eq!(fields(parse(Some(q), 100, 500).unwrap_err()), want, "{q}");
        }
        let long = format!("cursor={}", "a".repeat(CURSOR_MAX + 1));
        assert_eq!(
            fields(parse(Some(&long), 100, 500).unwrap_err()),
            vec!["cursor"]
        );
    }

    #[test]
    fn cursors_open_only_in_their_tenant_and_list() {
        let keys = Arc::new(Keys::derive(b"a secret of at least thirty-two bytes"));
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let asked = |c: Option<String>| Asked {
            limit: 2,
            cursor: c,
        };
        let page = Page::open(Arc::clone(&keys), a, "events", asked(None)).unwrap();
        let c = page.cursor(b"position 7");
        let back = Page::open(Arc::clone(&keys), a, "events", asked(Some(c.clone()))).unwrap();
        assert_eq!(back.after.as_deref(), Some(b"position 7".as_slice()));
        for (tenant, list, cursor) in [
            (b, "events", c.clone()),
            (a, "opt-outs", c.clone()),
            (a, "events", format!("{c}A")),
            (a, "events", "0-12".to_string()),
        ] {
            assert!(
                Page::open(Arc::clone(&keys), tenant, list, asked(Some(cursor))).is_err(),
                "{list}"
            );
        }
        // The same position twice: two different texts (nothing to compare).
        assert_ne!(page.cursor(b"p"), page.cursor(b"p"));
        let (items, next) = page.finish(vec![1u8, 2, 3], |i| vec![*i]);
        assert_eq!(items, vec![1, 2]);
        let next = Page::open(Arc::clone(&keys), a, "events", asked(next)).unwrap();
        assert_eq!(next.after, Some(vec![2]));
        assert_eq!(page.finish(vec![1u8, 2], |i| vec![*i]).1, None);
    }
}
