//! A minimal SMSC for the conformance table's `smpp` column: binds (or
//! refuses), and answers each `submit_sm` as scripted, counting the
//! messages it created. It never de-duplicates.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use sendonce::provider::smpp::pdu::{self, id, status};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Smsc {
    /// `ESME_ROK` with a fresh message_id (created).
    Accept,
    /// As `Accept`, then a `deliver_sm` receipt `DELIVRD` for it and one
    /// for an id it never gave.
    AcceptAndReceipt,
    /// This status, nothing created.
    Answer(u32),
    /// The bind is refused with this status.
    RefuseBind(u32),
    /// Created, never answered.
    AcceptSilently,
    /// Not created, never answered.
    Silent,
}

/// Listens on a free port; `created` counts messages created.
pub async fn start(behaviour: Smsc) -> (SocketAddr, Arc<AtomicU32>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let addr = listener.local_addr().expect("addr");
    let created = Arc::new(AtomicU32::new(0));
    let c = Arc::clone(&created);
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(serve(sock, behaviour, Arc::clone(&c)));
        }
    });
    (addr, created)
}

async fn serve(mut sock: tokio::net::TcpStream, behaviour: Smsc, created: Arc<AtomicU32>) {
    let mut head = [0u8; 16];
    loop {
        if sock.read_exact(&mut head).await.is_err() {
            return;
        }
        let Ok(h) = pdu::header(&head) else { return };
        let mut body = vec![0u8; h.command_length as usize - 16];
        if sock.read_exact(&mut body).await.is_err() {
            return;
        }
        let reply = match h.command_id {
            id::BIND_TRANSCEIVER => match behaviour {
                Smsc::RefuseBind(s) => pdu::encode(id::BIND_TRANSCEIVER_RESP, s, h.sequence, &[]),
                _ => pdu::encode(
                    id::BIND_TRANSCEIVER_RESP,
                    0,
                    h.sequence,
                    &pdu::id_body("smsc"),
                ),
            },
            id::SUBMIT_SM => match behaviour {
                Smsc::AcceptAndReceipt => {
                    let n = created.fetch_add(1, Ordering::SeqCst) + 1;
                    let mut out = pdu::encode(
                        id::SUBMIT_SM_RESP,
                        status::ROK,
                        h.sequence,
                        &pdu::id_body(&format!("smsc-{n}")),
                    );
                    for (k, rid) in [format!("smsc-{n}"), format!("never-given-{n}")]
                        .iter()
                        .enumerate()
                    {
                        let text = format!(
                            "id:{rid} sub:001 dlvrd:001 submit date:2601011200 done date:2601011201 stat:DELIVRD err:000 text:"
                        );
                        let body = pdu::Submit {
                            source_addr: "+14155550100".into(),
                            destination_addr: "sendonce".into(),
                            esm_class: pdu::ESM_RECEIPT,
                            registered_delivery: 0,
                            data_coding: 0,
                            short_message: text.into_bytes(),
                        }
                        .body();
                        out.extend(pdu::encode(
                            id::DELIVER_SM,
                            0,
                            1000 + n * 2 + k as u32,
                            &body,
                        ));
                    }
                    out
                }
                Smsc::Accept => {
                    let n = created.fetch_add(1, Ordering::SeqCst) + 1;
                    pdu::encode(
                        id::SUBMIT_SM_RESP,
                        status::ROK,
                        h.sequence,
                        &pdu::id_body(&format!("smsc-{n}")),
                    )
                }
                Smsc::Answer(s) => pdu::encode(id::SUBMIT_SM_RESP, s, h.sequence, &[]),
                Smsc::AcceptSilently => {
                    created.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                Smsc::Silent | Smsc::RefuseBind(_) => continue,
            },
            id::ENQUIRE_LINK => pdu::encode(id::ENQUIRE_LINK_RESP, 0, h.sequence, &[]),
            id::UNBIND => pdu::encode(id::UNBIND_RESP, 0, h.sequence, &[]),
            _ => continue,
        };
        if sock.write_all(&reply).await.is_err() {
            return;
        }
        if h.command_id == id::BIND_TRANSCEIVER && matches!(behaviour, Smsc::RefuseBind(_)) {
            return;
        }
    }
}
