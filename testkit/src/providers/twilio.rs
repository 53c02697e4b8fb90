//! The mock's Twilio: `POST /2010-04-01/Accounts/{sid}/Messages.json`
//! (form-encoded, Basic auth; every accepted call creates a message, as
//! Twilio does: no de-duplication) and `GET` on the same path (the list,
//! filtered by `To` and `DateSent>`, newest first by creation, paged), with
//! Twilio's error bodies. As at Twilio, a created message stays `queued`
//! with a null `date_sent` until it is handed to the carrier
//! ([`MockProvider::twilio_hand_over`]). Twilio documents no bound on how
//! soon a message it created shows in the list, so the list may lag
//! ([`MockProvider::twilio_set_list_lag`]: a message created less than the
//! lag ago is not listed yet). Status callbacks go to each
//! message's `StatusCallback`, signed with the auth token the request was
//! authenticated with.

use std::collections::HashMap;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

use crate::mock_provider::{
    Busy, Call, DropSwitch, MockProvider, ReceiptConfig, ReceiptOrder, Answer, Played, play,
    json_answer, receipt_client,
};

/// Twilio's routes.
pub fn routes(router: Router<MockProvider>) -> Router<MockProvider> {
    router.route(
        "/2010-04-01/Accounts/{account_sid}/Messages.json",
        post(twilio_send).get(twilio_list),
    )
}

/// What only the Twilio protocol keeps.
#[derive(Default)]
pub(crate) struct Protocol {
    /// How far the mock Twilio's clock is from this machine's (its
    /// `date_created` and its `Date` header).
    clock_offset: time::Duration,
    /// Messages created through the Twilio endpoint, oldest first.
    messages: Vec<TwilioRecord>,
    /// How many of the next message list lookups fail.
    failing_lookups: usize,
    /// How long a created message stays out of the list.
    list_lag: Duration,
}

/// A message created through the Twilio endpoint.
#[derive(Clone, Debug)]
struct TwilioRecord {
    sid: String,
    account_sid: String,
    to: String,
    from: Option<String>,
    messaging_service_sid: Option<String>,
    body: String,
    created_at: time::OffsetDateTime,
    /// `queued` until handed to the carrier, then `sent`.
    status: &'static str,
    /// Null until handed to the carrier, as at Twilio.
    date_sent: Option<time::OffsetDateTime>,
    /// When it was created, on this machine's monotonic clock (the list's
    /// lag is judged by it).
    created: std::time::Instant,
}

impl MockProvider {
    /// Sets the mock Twilio's clock `offset` from this machine's (positive:
    /// ahead): the times it shows and its `Date` header.
    pub fn set_twilio_clock_offset(&self, offset: time::Duration) {
        self.lock().protocol::<Protocol>().clock_offset = offset;
    }

    /// `resp` with the mock Twilio's own `Date` header (its clock may be
    /// set apart from this machine's).
    fn twilio_dated(&self, mut resp: Response) -> Response {
        let offset = self.lock().protocol::<Protocol>().clock_offset;
        let now = std::time::SystemTime::now();
        let at = if offset.is_negative() {
            now - offset.unsigned_abs()
        } else {
            now + offset.unsigned_abs()
        };
        if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(at)) {
            resp.headers_mut().insert(header::DATE, v);
        }
        resp
    }

    /// Makes created messages stay out of the message list for `lag`
    /// (judged at each lookup: zero lists every message at once).
    pub fn twilio_set_list_lag(&self, lag: Duration) {
        self.lock().protocol::<Protocol>().list_lag = lag;
    }

    /// Makes the next `n` Twilio message list lookups answer 500.
    pub fn fail_lookups(&self, n: usize) {
        self.lock().protocol::<Protocol>().failing_lookups = n;
    }

    /// Creates a Twilio message (a delivery) and returns its resource.
    fn twilio_create(&self, account_sid: &str, form: &HashMap<String, String>) -> TwilioRecord {
        let mut inner = self.lock();
        let now = time::OffsetDateTime::now_utc() + inner.protocol::<Protocol>().clock_offset;
        let record = TwilioRecord {
            sid: format!("SM{}", uuid::Uuid::new_v4().simple()),
            account_sid: account_sid.to_string(),
            to: form.get("To").cloned().unwrap_or_default(),
            from: form.get("From").cloned(),
            messaging_service_sid: form.get("MessagingServiceSid").cloned(),
            body: form.get("Body").cloned().unwrap_or_default(),
            created_at: sendonce::clock::truncate_to_micros(now),
            status: "queued",
            date_sent: None,
            created: std::time::Instant::now(),
        };
        *inner
            .by_recipient_body
            .entry((record.to.clone(), record.body.clone()))
            .or_default() += 1;
        inner.protocol::<Protocol>().messages.push(record.clone());
        record
    }

    /// Hands every queued Twilio message to the carrier: `sent`, with
    /// `date_sent` now (Twilio sets it only then).
    pub fn twilio_hand_over(&self) {
        let mut inner = self.lock();
        let now = sendonce::clock::truncate_to_micros(
            time::OffsetDateTime::now_utc() + inner.protocol::<Protocol>().clock_offset,
        );
        for m in &mut inner.protocol::<Protocol>().messages {
            if m.date_sent.is_none() {
                m.status = "sent";
                m.date_sent = Some(now);
            }
        }
    }

    /// Moves the times of every Twilio message created so far back by `by`,
    /// as if they had been created that much earlier.
    pub fn twilio_backdate(&self, by: Duration) {
        let by = time::Duration::try_from(by).unwrap_or(time::Duration::ZERO);
        for m in &mut self.lock().protocol::<Protocol>().messages {
            m.created_at -= by;
            m.date_sent = m.date_sent.map(|d| d - by);
        }
    }

    /// The sids of the messages created through the Twilio endpoint, oldest
    /// first.
    pub fn twilio_sids(&self) -> Vec<String> {
        self.lock()
            .protocol::<Protocol>()
            .messages
            .iter()
            .map(|m| m.sid.clone())
            .collect()
    }
}

/// Twilio's error body.
fn twilio_error(status: u16, code: i64, message: &str, retry_after: Option<u64>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::json!({
        "code": code,
        "message": message,
        "more_info": format!("https://www.protocol::<Protocol>().com/docs/errors/{code}"),
        "status": status.as_u16(),
    });
    json_answer(status, &body, retry_after)
}

/// A scripted failure as Twilio would send it: the scripted body when it is
/// already Twilio's shape, else wrapped in one.
fn twilio_failure(status: u16, body: &serde_json::Value, retry_after: Option<u64>) -> Response {
    if body.get("code").is_some() {
        let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (
            code,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
        if let Some(secs) = retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        return resp;
    }
    let code = match status {
        429 => 20429,
        500..=599 => 20500,
        _ => 21000,
    };
    let message = body["message"].as_str().unwrap_or("injected failure");
    twilio_error(status, code, message, retry_after)
}

/// The password of `Basic` credentials whose user is `account_sid`.
fn basic_password(headers: &HeaderMap, account_sid: &str) -> Option<String> {
    use base64::Engine;
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    (user == account_sid && !password.is_empty()).then(|| password.to_string())
}

fn rfc2822(t: time::OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc2822)
        .unwrap_or_default()
}

/// A Message resource as Twilio shows it.
fn twilio_resource(m: &TwilioRecord) -> serde_json::Value {
    let date = rfc2822(m.created_at);
    let status = m.status;
    serde_json::json!({
        "account_sid": m.account_sid,
        "api_version": "2010-04-01",
        "body": m.body,
        "date_created": date,
        "date_sent": m.date_sent.map(rfc2822),
        "date_updated": rfc2822(m.date_sent.unwrap_or(m.created_at)),
        "direction": "outbound-api",
        "error_code": null,
        "error_message": null,
        "from": m.from,
        "messaging_service_sid": m.messaging_service_sid,
        "num_media": "0",
        "num_segments": "1",
        "price": null,
        "price_unit": "USD",
        "sid": m.sid,
        "status": status,
        "subresource_uris": {
            "media": format!("/2010-04-01/Accounts/{}/Messages/{}/Media.json", m.account_sid, m.sid),
        },
        "to": m.to,
        "uri": format!("/2010-04-01/Accounts/{}/Messages/{}.json", m.account_sid, m.sid),
    })
}

async fn twilio_send(
    State(mock): State<MockProvider>,
    axum::extract::Path(account_sid): axum::extract::Path<String>,
    switch: Option<axum::Extension<DropSwitch>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form: HashMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
    let busy = Busy::new(&mock);
    let (behaviour, latency) = {
        let mut inner = mock.lock();
        inner.calls.push(Call {
            endpoint: "twilio".into(),
            idempotency_key: None,
            authorization: headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            body: serde_json::to_value(&form).unwrap_or(serde_json::Value::Null),
        });
        inner.next_behaviour()
    };
    let Some(token) = basic_password(&headers, &account_sid) else {
        return twilio_error(401, 20003, "Authenticate", None);
    };
    if form.get("To").is_none_or(String::is_empty) {
        return twilio_error(400, 21604, "A 'To' phone number is required.", None);
    }
    if form.get("Body").is_none_or(String::is_empty) {
        return twilio_error(400, 21602, "Message body is required.", None);
    }
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let behaviour = behaviour.after_gates().await;
    let create = {
        let (mock, account_sid, form) = (mock.clone(), account_sid.clone(), form.clone());
        move || {
            let record = mock.twilio_create(&account_sid, &form);
            let receipts = mock.lock().receipts.clone();
            if let Some(callback) = form.get("StatusCallback").cloned()
                && receipts.order != ReceiptOrder::None
            {
                tokio::spawn(send_twilio_receipts(
                    receipts,
                    callback,
                    token.clone(),
                    record.clone(),
                ));
            }
            record
        }
    };
    let created = |record: &TwilioRecord| {
        mock.twilio_dated(
            (
                StatusCode::CREATED,
                [(header::CONTENT_TYPE, "application/json")],
                twilio_resource(record).to_string(),
            )
                .into_response(),
        )
    };
    let (reply, create) = match play(behaviour, create, busy, switch).await {
        Played::Accepted(record) => return created(&record),
        Played::Lost => return twilio_error(500, 20500, "Internal Server Error", None),
        Played::Answer(reply, create) => (reply, create),
    };
    match reply {
        Answer::Accept => created(&create()),
        Answer::Fail {
            status,
            body,
            retry_after,
        } => twilio_failure(status, &body, retry_after),
        Answer::AcceptThenFail { status } => {
            create();
            twilio_error(status, 20500, "Internal Server Error", None)
        }
        Answer::AcceptThenRetryLater {
            status,
            retry_after,
        } => {
            create();
            twilio_error(status, 20500, "Internal Server Error", Some(retry_after))
        }
        Answer::RejectQuoting { status } => {
            let text = form.get("Body").cloned().unwrap_or_default();
            twilio_error(status, 21617, &format!("invalid message '{text}'"), None)
        }
    }
}

/// `DateSent>`'s value: an RFC 3339 time or a `YYYY-MM-DD` date (GMT).
fn parse_date_filter(value: &str) -> Option<time::OffsetDateTime> {
    use time::format_description::well_known::Rfc3339;
    if let Ok(t) = time::OffsetDateTime::parse(value, &Rfc3339) {
        return Some(t);
    }
    let format = time::macros::format_description!("[year]-[month]-[day]");
    time::Date::parse(value, &format)
        .ok()
        .map(|d| d.midnight().assume_utc())
}

async fn twilio_list(
    State(mock): State<MockProvider>,
    axum::extract::Path(account_sid): axum::extract::Path<String>,
    headers: HeaderMap,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let query: HashMap<String, String> =
        form_urlencoded::parse(query.unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    {
        let mut inner = mock.lock();
        inner.lookups += 1;
        if inner.protocol::<Protocol>().failing_lookups > 0 {
            inner.protocol::<Protocol>().failing_lookups -= 1;
            return twilio_error(500, 20500, "injected lookup failure", None);
        }
    }
    if basic_password(&headers, &account_sid).is_none() {
        return twilio_error(401, 20003, "Authenticate", None);
    }
    let after = match query.get("DateSent>") {
        None => None,
        Some(v) => match parse_date_filter(v) {
            Some(t) => Some(t),
            None => return twilio_error(400, 20001, "Invalid DateSent", None),
        },
    };
    let page_size = query
        .get("PageSize")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(50)
        .clamp(1, 1000);
    let page = query
        .get("Page")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut inner = mock.lock();
    let p = inner.protocol::<Protocol>();
    let lag = p.list_lag;
    let mut matching: Vec<TwilioRecord> = p
        .messages
        .iter()
        .rev()
        .filter(|m| m.created.elapsed() >= lag)
        .filter(|m| m.account_sid == account_sid)
        .filter(|m| query.get("To").is_none_or(|to| &m.to == to))
        // Twilio's date filters match `date_sent`: never a message not sent yet.
        .filter(|m| after.is_none_or(|a| m.date_sent.is_some_and(|d| d >= a)))
        .cloned()
        .collect();
    drop(inner);
    // Newest first by creation.
    matching.sort_by_key(|m| std::cmp::Reverse(m.created_at));
    let messages: Vec<serde_json::Value> = matching
        .iter()
        .skip(page * page_size)
        .take(page_size)
        .map(twilio_resource)
        .collect();
    let path = format!("/2010-04-01/Accounts/{account_sid}/Messages.json");
    let page_uri = |n: usize| {
        let mut q = form_urlencoded::Serializer::new(String::new());
        if let Some(to) = query.get("To") {
            q.append_pair("To", to);
        }
        if let Some(after) = query.get("DateSent>") {
            q.append_pair("DateSent>", after);
        }
        q.append_pair("PageSize", &page_size.to_string());
        q.append_pair("Page", &n.to_string());
        format!("{path}?{}", q.finish())
    };
    let more = matching.len() > (page + 1) * page_size;
    let body = serde_json::json!({
        "messages": messages,
        "first_page_uri": page_uri(0),
        "next_page_uri": more.then(|| page_uri(page + 1)),
        "previous_page_uri": (page > 0).then(|| page_uri(page - 1)),
        "page": page,
        "page_size": page_size,
        "uri": page_uri(page),
        "end": page * page_size + messages.len().saturating_sub(1),
        "start": page * page_size,
    });
    mock.twilio_dated(axum::Json(body).into_response())
}

/// Posts Twilio status callbacks for `m`, one after the other, signed.
async fn send_twilio_receipts(
    config: ReceiptConfig,
    callback: String,
    auth_token: String,
    m: TwilioRecord,
) {
    let Some(client) = receipt_client() else {
        return;
    };
    for (status, event) in config.plan() {
        let mut params = vec![
            ("AccountSid".to_string(), m.account_sid.clone()),
            ("ApiVersion".to_string(), "2010-04-01".to_string()),
            ("MessageSid".to_string(), m.sid.clone()),
            ("MessageStatus".to_string(), status.clone()),
            ("SmsSid".to_string(), m.sid.clone()),
            ("SmsStatus".to_string(), status.clone()),
            ("To".to_string(), m.to.clone()),
        ];
        if let Some(from) = &m.from {
            params.push(("From".to_string(), from.clone()));
        }
        if event == 1
            && let Some(code) = &config.error_code
        {
            params.push(("ErrorCode".to_string(), code.clone()));
        }
        let signature = sendonce::provider::twilio::signature(&auth_token, &callback, &params);
        let sent = client
            .post(&callback)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header("X-Twilio-Signature", signature)
            .header(
                "I-Twilio-Idempotency-Token",
                format!("mock-{}-{event}", m.sid),
            )
            .body(sendonce::provider::twilio::encode_form(&params))
            .send()
            .await;
        if let Err(e) = sent {
            tracing::warn!(error = %e, "mock provider: a status callback failed");
        }
    }
}
