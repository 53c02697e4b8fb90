//! One SMPP session: connecting (TLS or not), binding, the request window,
//! `enquire_link`, reading and answering the SMSC's PDUs, and the loop that
//! keeps a bind slot bound.

use super::*;

/// A response to one of our requests.
#[derive(Debug)]
pub(super) struct Resp {
    pub(super) status: u32,
    pub(super) body: Vec<u8>,
}

/// Why a request got no response.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Lost {
    /// It never left: the session closed first.
    NotWritten,
    /// The session ended after it was handed over.
    Dropped,
    /// No response within the timeout.
    Timeout,
}

/// A frame for the writer, with the sequence of the request it carries.
struct Out {
    frame: Vec<u8>,
    seq: Option<u32>,
}

type Pending = Mutex<HashMap<u32, oneshot::Sender<Result<Resp, Lost>>>>;

/// One connection to the SMSC.
#[derive(Debug)]
pub(super) struct Session {
    out: mpsc::Sender<Out>,
    pending: Arc<Pending>,
    seq: AtomicU32,
    window: Semaphore,
    /// Room for the SMSC's requests (`deliver_sm`) handled at once: the
    /// window, as for ours. The reader waits for room before it reads on,
    /// so a flood waits in the socket (back-pressure on the SMSC), not in
    /// tasks holding their bodies (issue 41, finding 3).
    inbound: Arc<Semaphore>,
    /// Cancelled when the connection is done.
    pub(super) closed: CancellationToken,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Out").field("seq", &self.seq).finish()
    }
}

impl Session {
    fn next_seq(&self) -> u32 {
        // 1..=0x7FFFFFFF.
        (self.seq.fetch_add(1, Ordering::Relaxed) % 0x7FFF_FFFF) + 1
    }

    /// One request and its response. Room in the window is waited for
    /// until `write_by` (if any, else the timeout): `NotWritten` past it.
    pub(super) async fn request(
        &self,
        command_id: u32,
        body: &[u8],
        write_by: Option<Instant>,
        timeout: Duration,
    ) -> Result<Resp, Lost> {
        let deadline = Instant::now() + timeout;
        let room_by = write_by.map_or(deadline, |w| w.min(deadline));
        let Ok(Ok(_permit)) = tokio::time::timeout_at(room_by, self.window.acquire()).await else {
            return Err(Lost::NotWritten);
        };
        if self.closed.is_cancelled() {
            return Err(Lost::NotWritten);
        }
        let seq = self.next_seq();
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(seq, tx);
        let frame = pdu::encode(command_id, 0, seq, body);
        if self
            .out
            .send(Out {
                frame,
                seq: Some(seq),
            })
            .await
            .is_err()
        {
            lock(&self.pending).remove(&seq);
            return Err(Lost::NotWritten);
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(Lost::Dropped),
            Err(_) => {
                lock(&self.pending).remove(&seq);
                Err(Lost::Timeout)
            }
        }
    }

    /// Sends a frame that expects no answer (a response of ours).
    async fn reply(&self, command_id: u32, command_status: u32, seq: u32, body: &[u8]) {
        let frame = pdu::encode(command_id, command_status, seq, body);
        let _ = self.out.send(Out { frame, seq: None }).await;
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

async fn connect(s: &SmppSettings) -> Result<Box<dyn Io>, String> {
    let addr = (s.host.as_str(), s.port);
    let tcp = tokio::time::timeout(s.connect_timeout, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    if !s.tls {
        return Ok(Box::new(tcp));
    }
    let config = tls_config(s)?;
    let name = rustls::pki_types::ServerName::try_from(s.host.clone())
        .map_err(|e| format!("SMPP_HOST is not a TLS server name: {e}"))?;
    let tls = tokio::time::timeout(
        s.connect_timeout,
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp),
    )
    .await
    .map_err(|_| "TLS handshake timed out".to_string())?
    .map_err(|e| format!("TLS handshake: {e}"))?;
    Ok(Box::new(tls))
}

/// The platform's roots, as reqwest verifies the HTTP providers, or only
/// the CA certificates of `SMPP_TLS_CA_FILE`.
fn tls_config(s: &SmppSettings) -> Result<rustls::ClientConfig, String> {
    use rustls_platform_verifier::ConfigVerifierExt;
    let Some(path) = &s.tls_ca_file else {
        return rustls::ClientConfig::with_platform_verifier()
            .map_err(|e| format!("TLS setup: {e}"));
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in settings::ca_certificates(path)? {
        roots
            .add(cert)
            .map_err(|e| format!("{path}: not a CA certificate: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// How one session ended.
enum Ended {
    /// The service is stopping.
    Stopped,
    /// The connection was lost or refused; reconnect.
    Lost(String),
}

/// Keeps bind `slot` bound until `runtime.stop`.
pub(super) async fn bind_loop(inner: Arc<Inner>, slot: usize, runtime: ProviderRuntime) {
    let mut backoff = BACKOFF_MIN;
    loop {
        if runtime.stop.is_cancelled() {
            return;
        }
        let attempt = tokio::select! {
            () = runtime.stop.cancelled() => return,
            c = connect(&inner.settings) => c,
        };
        match attempt {
            Err(e) => tracing::warn!(slot, error = %e, "SMPP connect failed"),
            Ok(io) => match session(&inner, slot, io, &runtime, &mut backoff).await {
                Ended::Stopped => return,
                Ended::Lost(why) => tracing::warn!(slot, reason = %why, "SMPP session ended"),
            },
        }
        tokio::select! {
            () = runtime.stop.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Binds over `io` and serves the session until it ends.
async fn session(
    inner: &Arc<Inner>,
    slot: usize,
    io: Box<dyn Io>,
    runtime: &ProviderRuntime,
    backoff: &mut Duration,
) -> Ended {
    let s = &inner.settings;
    let (read, write) = tokio::io::split(io);
    let (out_tx, out_rx) = mpsc::channel(s.window.max(1) * 2 + 8);
    let session = Arc::new(Session {
        out: out_tx,
        pending: Arc::default(),
        seq: AtomicU32::new(0),
        window: Semaphore::new(s.window.max(1)),
        inbound: Arc::new(Semaphore::new(s.window.max(1))),
        closed: CancellationToken::new(),
    });
    let writer = tokio::spawn(write_loop(
        write,
        out_rx,
        Arc::clone(&session),
        s.response_timeout,
    ));
    let reader = tokio::spawn(read_loop(
        read,
        Arc::clone(&session),
        Arc::clone(&runtime.receipts),
    ));
    let ended = serve(inner, slot, &session, runtime, backoff).await;
    inner.set(slot, None);
    session.closed.cancel();
    let _ = writer.await;
    reader.abort();
    let _ = reader.await;
    // Whatever still waits was handed over and never answered.
    let pending: Vec<_> = lock(&session.pending).drain().collect();
    for (_, tx) in pending {
        let _ = tx.send(Err(Lost::Dropped));
    }
    ended
}

async fn serve(
    inner: &Arc<Inner>,
    slot: usize,
    session: &Arc<Session>,
    runtime: &ProviderRuntime,
    backoff: &mut Duration,
) -> Ended {
    let s = &inner.settings;
    let bind = pdu::Bind {
        system_id: s.system_id.clone(),
        password: s.password.clone(),
        system_type: s.system_type.clone(),
    };
    let bind = bind.body();
    let answer = tokio::select! {
        () = runtime.stop.cancelled() => return Ended::Stopped,
        a = session.request(id::BIND_TRANSCEIVER, &bind, None, s.response_timeout) => a,
    };
    match answer {
        Ok(r) if r.status == status::ROK => {}
        Ok(r) => {
            if refuses_account(r.status) {
                *lock(&inner.refused) = Some(r.status);
                inner.changed.notify_waiters();
            }
            return Ended::Lost(format!(
                "bind_transceiver refused: command_status 0x{:08X}",
                r.status
            ));
        }
        Err(e) => return Ended::Lost(format!("no bind_transceiver_resp: {e:?}")),
    }
    *lock(&inner.refused) = None;
    *backoff = BACKOFF_MIN;
    inner.set(slot, Some(Arc::clone(session)));
    tracing::info!(slot, "SMPP session bound");
    let mut tick = tokio::time::interval_at(
        Instant::now() + s.enquire_link_interval,
        s.enquire_link_interval,
    );
    loop {
        tokio::select! {
            () = runtime.stop.cancelled() => {
                inner.set(slot, None);
                // In-flight submits finished before the stop (the service
                // drains its sends first); say goodbye.
                let _ = session.request(id::UNBIND, &[], None, UNBIND_WAIT).await;
                return Ended::Stopped;
            }
            () = session.closed.cancelled() => return Ended::Lost("connection closed".into()),
            _ = tick.tick() => {
                let s2 = Arc::clone(session);
                let timeout = s.response_timeout;
                tokio::spawn(async move {
                    if s2.request(id::ENQUIRE_LINK, &[], None, timeout).await.is_err() {
                        tracing::warn!("no enquire_link_resp: ending the session");
                        s2.closed.cancel();
                    }
                });
            }
        }
    }
}

/// Writes the session's frames in order. A frame not written within
/// `deadline` (an SMSC that stopped reading) ends the session: nothing
/// waits on it for ever, and its requests end as not written.
async fn write_loop(
    mut write: tokio::io::WriteHalf<Box<dyn Io>>,
    mut rx: mpsc::Receiver<Out>,
    session: Arc<Session>,
    deadline: Duration,
) {
    loop {
        let out = tokio::select! {
            biased;
            o = rx.recv() => o,
            () = session.closed.cancelled() => None,
        };
        let Some(out) = out else { break };
        let written = tokio::time::timeout(deadline, async {
            write.write_all(&out.frame).await?;
            write.flush().await
        })
        .await;
        let ok = matches!(written, Ok(Ok(())));
        if written.is_err() {
            tracing::warn!(
                deadline_ms = deadline.as_millis() as u64,
                "the SMSC read nothing for too long: ending the session"
            );
        }
        if !ok {
            // Some of it may have left: its request waits as Dropped.
            session.closed.cancel();
            break;
        }
    }
    rx.close();
    while let Ok(out) = rx.try_recv() {
        if let Some(tx) = out.seq.and_then(|seq| lock(&session.pending).remove(&seq)) {
            let _ = tx.send(Err(Lost::NotWritten));
        }
    }
    let _ = write.shutdown().await;
}

async fn read_loop(
    mut read: tokio::io::ReadHalf<Box<dyn Io>>,
    session: Arc<Session>,
    receipts: Arc<dyn ReceiptSink>,
) {
    let mut head = [0u8; pdu::HEADER_LEN];
    loop {
        if read.read_exact(&mut head).await.is_err() {
            break;
        }
        let h = match pdu::header(&head) {
            Ok(h) => h,
            Err(e) => {
                // Framing is lost: answer and end the session.
                tracing::warn!(error = %e, "unreadable SMPP PDU");
                session
                    .reply(id::GENERIC_NACK, status::RINVMSGLEN, 0, &[])
                    .await;
                break;
            }
        };
        let mut body = vec![0u8; h.command_length as usize - pdu::HEADER_LEN];
        if read.read_exact(&mut body).await.is_err() {
            break;
        }
        handle(&session, h, body, &receipts).await;
    }
    session.closed.cancel();
}

async fn handle(
    session: &Arc<Session>,
    h: pdu::Header,
    body: Vec<u8>,
    receipts: &Arc<dyn ReceiptSink>,
) {
    if h.command_id & id::RESPONSE != 0 {
        let waiting = lock(&session.pending).remove(&h.sequence);
        match waiting {
            Some(tx) => {
                let _ = tx.send(Ok(Resp {
                    status: h.command_status,
                    body,
                }));
            }
            None => tracing::debug!(
                sequence = h.sequence,
                "SMPP response for no request waiting (late, after its timeout)"
            ),
        }
        return;
    }
    match h.command_id {
        id::ENQUIRE_LINK => {
            session
                .reply(id::ENQUIRE_LINK_RESP, status::ROK, h.sequence, &[])
                .await;
        }
        id::UNBIND => {
            session
                .reply(id::UNBIND_RESP, status::ROK, h.sequence, &[])
                .await;
            // Let the writer send it, then end.
            let s = Arc::clone(session);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                s.closed.cancel();
            });
        }
        id::DELIVER_SM => {
            // Room first: the reader reads no further until there is.
            let room = tokio::select! {
                r = Arc::clone(&session.inbound).acquire_owned() => r,
                () = session.closed.cancelled() => return,
            };
            let Ok(room) = room else { return };
            let s = Arc::clone(session);
            let receipts = Arc::clone(receipts);
            tokio::spawn(async move {
                let code = deliver(&body, receipts.as_ref()).await;
                s.reply(id::DELIVER_SM_RESP, code, h.sequence, &pdu::id_body(""))
                    .await;
                drop(room);
            });
        }
        _ => {
            session
                .reply(id::GENERIC_NACK, status::RINVCMDID, h.sequence, &[])
                .await;
        }
    }
}

/// Takes one `deliver_sm`: a receipt is stored; the status to answer.
async fn deliver(body: &[u8], receipts: &dyn ReceiptSink) -> u32 {
    let sm = match pdu::Sm::decode(body) {
        Ok(sm) => sm,
        Err(e) => {
            tracing::warn!(error = %e, "unreadable deliver_sm acknowledged");
            return status::ROK;
        }
    };
    let Some(r) = pdu::receipt(&sm) else {
        tracing::info!(
            esm_class = sm.esm_class,
            "deliver_sm that is not a receipt acknowledged"
        );
        return status::ROK;
    };
    let receipt = Receipt {
        provider_message_id: r.message_id,
        status: r.stat,
        error_code: r.err,
        message_id: None,
    };
    let mapped = delivery_status(&receipt.status);
    match receipts.take(ADAPTER.name, receipt, mapped).await {
        Ok(()) => status::ROK,
        Err(e) => {
            tracing::warn!(error = %e, "SMPP receipt not stored: the SMSC is asked to resend");
            status::RSYSERR
        }
    }
}
