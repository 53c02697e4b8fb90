//! SMPP v3.4 PDUs: the few this client speaks, encoded and decoded.
//!
//! Every PDU is a 16-byte header (`command_length`, `command_id`,
//! `command_status`, `sequence_number`, big-endian) and a body of
//! C-octet strings (NUL-terminated), integers and, for `deliver_sm`,
//! optional TLVs. Decoding never panics: anything short or malformed is an
//! error the session answers or drops.

/// `command_id`s.
pub mod id {
    pub const GENERIC_NACK: u32 = 0x8000_0000;
    pub const BIND_TRANSCEIVER: u32 = 0x0000_0009;
    pub const BIND_TRANSCEIVER_RESP: u32 = 0x8000_0009;
    pub const SUBMIT_SM: u32 = 0x0000_0004;
    pub const SUBMIT_SM_RESP: u32 = 0x8000_0004;
    pub const DELIVER_SM: u32 = 0x0000_0005;
    pub const DELIVER_SM_RESP: u32 = 0x8000_0005;
    pub const UNBIND: u32 = 0x0000_0006;
    pub const UNBIND_RESP: u32 = 0x8000_0006;
    pub const ENQUIRE_LINK: u32 = 0x0000_0015;
    pub const ENQUIRE_LINK_RESP: u32 = 0x8000_0015;
    /// Responses have this bit.
    pub const RESPONSE: u32 = 0x8000_0000;
}

/// `command_status` values this client tells apart.
pub mod status {
    pub const ROK: u32 = 0x0000_0000;
    pub const RINVMSGLEN: u32 = 0x0000_0001;
    pub const RINVCMDID: u32 = 0x0000_0003;
    pub const RSYSERR: u32 = 0x0000_0008;
    pub const RINVSRCADR: u32 = 0x0000_000A;
    pub const RINVDSTADR: u32 = 0x0000_000B;
    pub const RBINDFAIL: u32 = 0x0000_000D;
    pub const RINVPASWD: u32 = 0x0000_000E;
    pub const RINVSYSID: u32 = 0x0000_000F;
    pub const RMSGQFUL: u32 = 0x0000_0014;
    pub const RTHROTTLED: u32 = 0x0000_0058;
}

/// Optional parameter tags read from `deliver_sm`.
pub mod tag {
    pub const RECEIPTED_MESSAGE_ID: u16 = 0x001E;
    pub const MESSAGE_STATE: u16 = 0x0427;
}

/// `esm_class`: the short message starts with a user data header.
pub const ESM_UDHI: u8 = 0x40;
/// `esm_class` of a `deliver_sm`: it is an SMSC delivery receipt.
pub const ESM_RECEIPT: u8 = 0x04;

/// The header's size, and the smallest PDU.
pub const HEADER_LEN: usize = 16;
/// The largest PDU read; a longer `command_length` ends the session.
pub const MAX_PDU_LEN: usize = 64 * 1024;

/// A PDU header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub command_length: u32,
    pub command_id: u32,
    pub command_status: u32,
    pub sequence: u32,
}

/// Why a PDU could not be read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    #[error("command_length {0} is out of bounds")]
    Length(u32),
    #[error("the PDU ends inside a field")]
    Short,
    #[error("a C-octet string has no terminating NUL within its size")]
    Unterminated,
}

/// Reads the header of `buf` (at least [`HEADER_LEN`] bytes) and checks
/// its length.
pub fn header(buf: &[u8]) -> Result<Header, PduError> {
    let mut r = Reader::new(buf);
    let h = Header {
        command_length: r.u32()?,
        command_id: r.u32()?,
        command_status: r.u32()?,
        sequence: r.u32()?,
    };
    let len = h.command_length as usize;
    if !(HEADER_LEN..=MAX_PDU_LEN).contains(&len) {
        return Err(PduError::Length(h.command_length));
    }
    Ok(h)
}

/// A whole PDU: `command_id`, status, sequence and the body.
pub fn encode(command_id: u32, command_status: u32, sequence: u32, body: &[u8]) -> Vec<u8> {
    let len = u32::try_from(HEADER_LEN + body.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&command_id.to_be_bytes());
    out.extend_from_slice(&command_status.to_be_bytes());
    out.extend_from_slice(&sequence.to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// A C-octet string cut to `max` bytes including its NUL.
fn cstr(out: &mut Vec<u8>, s: &str, max: usize) {
    let bytes = s.as_bytes();
    let n = bytes.len().min(max.saturating_sub(1));
    out.extend_from_slice(&bytes[..n]);
    out.push(0);
}

/// `bind_transceiver`'s body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bind {
    pub system_id: String,
    pub password: String,
    pub system_type: String,
}

impl Bind {
    pub fn body(&self) -> Vec<u8> {
        let mut b = Vec::new();
        cstr(&mut b, &self.system_id, 16);
        cstr(&mut b, &self.password, 9);
        cstr(&mut b, &self.system_type, 13);
        b.push(0x34); // interface_version 3.4
        b.push(0); // addr_ton
        b.push(0); // addr_npi
        cstr(&mut b, "", 41); // address_range
        b
    }

    pub fn decode(body: &[u8]) -> Result<Bind, PduError> {
        let mut r = Reader::new(body);
        Ok(Bind {
            system_id: r.cstr(16)?,
            password: r.cstr(9)?,
            system_type: r.cstr(13)?,
        })
    }
}

/// `submit_sm`'s body: what this client sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submit {
    pub source_addr: String,
    pub destination_addr: String,
    pub esm_class: u8,
    pub registered_delivery: u8,
    pub data_coding: u8,
    /// The user data header included, when `esm_class` has [`ESM_UDHI`].
    pub short_message: Vec<u8>,
}

/// TON/NPI of an address: international E.164 for `+` numbers, else
/// alphanumeric for a sender with letters, else unknown.
fn ton_npi(addr: &str) -> (u8, u8, &str) {
    if let Some(digits) = addr.strip_prefix('+') {
        (1, 1, digits)
    } else if addr.bytes().any(|b| !b.is_ascii_digit()) {
        (5, 0, addr)
    } else {
        (0, 1, addr)
    }
}

impl Submit {
    pub fn body(&self) -> Vec<u8> {
        let mut b = Vec::new();
        cstr(&mut b, "", 6); // service_type
        let (ton, npi, src) = ton_npi(&self.source_addr);
        b.push(ton);
        b.push(npi);
        cstr(&mut b, src, 21);
        let (ton, npi, dst) = ton_npi(&self.destination_addr);
        b.push(ton);
        b.push(npi);
        cstr(&mut b, dst, 21);
        b.push(self.esm_class);
        b.push(0); // protocol_id
        b.push(0); // priority_flag
        cstr(&mut b, "", 17); // schedule_delivery_time
        cstr(&mut b, "", 17); // validity_period
        b.push(self.registered_delivery);
        b.push(0); // replace_if_present_flag
        b.push(self.data_coding);
        b.push(0); // sm_default_msg_id
        let n = self.short_message.len().min(254);
        b.push(u8::try_from(n).unwrap_or(254));
        b.extend_from_slice(&self.short_message[..n]);
        b
    }
}

/// A `submit_sm` or `deliver_sm` body as read (the same layout).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sm {
    pub source_addr: String,
    pub destination_addr: String,
    pub esm_class: u8,
    pub registered_delivery: u8,
    pub data_coding: u8,
    pub short_message: Vec<u8>,
    /// `(tag, value)` of every TLV after the mandatory fields.
    pub tlvs: Vec<(u16, Vec<u8>)>,
}

impl Sm {
    pub fn decode(body: &[u8]) -> Result<Sm, PduError> {
        let mut r = Reader::new(body);
        r.cstr(6)?; // service_type
        r.u8()?;
        r.u8()?;
        let source_addr = r.cstr(21)?;
        r.u8()?;
        r.u8()?;
        let destination_addr = r.cstr(21)?;
        let esm_class = r.u8()?;
        r.u8()?; // protocol_id
        r.u8()?; // priority_flag
        r.cstr(17)?;
        r.cstr(17)?;
        let registered_delivery = r.u8()?;
        r.u8()?; // replace_if_present_flag
        let data_coding = r.u8()?;
        r.u8()?; // sm_default_msg_id
        let len = usize::from(r.u8()?);
        let short_message = r.bytes(len)?.to_vec();
        let mut tlvs = Vec::new();
        while !r.is_empty() {
            let tag = r.u16()?;
            let len = usize::from(r.u16()?);
            tlvs.push((tag, r.bytes(len)?.to_vec()));
        }
        Ok(Sm {
            source_addr,
            destination_addr,
            esm_class,
            registered_delivery,
            data_coding,
            short_message,
            tlvs,
        })
    }

    pub fn tlv(&self, tag: u16) -> Option<&[u8]> {
        self.tlvs
            .iter()
            .find(|(t, _)| *t == tag)
            .map(|(_, v)| v.as_slice())
    }
}

/// The `message_id` of a `submit_sm_resp` (or the `system_id` of a bind
/// response): one C-octet string, absent when the status is an error.
pub fn resp_id(body: &[u8]) -> String {
    Reader::new(body).cstr(66).unwrap_or_default()
}

/// `submit_sm_resp`'s / `deliver_sm_resp`'s body.
pub fn id_body(message_id: &str) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, message_id, 65);
    b
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], PduError> {
        if self.buf.len() < n {
            return Err(PduError::Short);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, PduError> {
        Ok(self.bytes(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, PduError> {
        let b = self.bytes(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, PduError> {
        let b = self.bytes(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A C-octet string of at most `max` bytes with its NUL.
    fn cstr(&mut self, max: usize) -> Result<String, PduError> {
        if self.buf.is_empty() {
            return Err(PduError::Short);
        }
        let limit = self.buf.len().min(max);
        let end = self.buf[..limit]
            .iter()
            .position(|&b| b == 0)
            .ok_or(PduError::Unterminated)?;
        let s = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf = &self.buf[end + 1..];
        Ok(s)
    }
}

/// A delivery receipt read from a `deliver_sm`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryReceipt {
    /// The SMSC's message id (its `submit_sm_resp` `message_id`).
    pub message_id: String,
    /// `DELIVRD`, `UNDELIV`, ... (from `message_state` when only the TLV says).
    pub stat: String,
    pub err: Option<String>,
}

/// `message_state` values (SMPP 3.4, 5.2.28) in the receipt text's words.
fn state_word(state: u8) -> &'static str {
    match state {
        1 => "ENROUTE",
        2 => "DELIVRD",
        3 => "EXPIRED",
        4 => "DELETED",
        5 => "UNDELIV",
        6 => "ACCEPTD",
        8 => "REJECTD",
        _ => "UNKNOWN",
    }
}

/// The value of `key:` in the receipt text (`id:123 sub:001 ... stat:DELIVRD
/// err:000 text:...`), matched case-insensitively.
fn field(text: &str, key: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    let needle = format!("{key}:");
    let mut from = 0;
    while let Some(at) = lower[from..].find(&needle) {
        let start = from + at;
        // A whole word: at the start or after a space.
        if start == 0 || lower.as_bytes()[start - 1] == b' ' {
            let value = &text[start + needle.len()..];
            let end = value.find(' ').unwrap_or(value.len());
            return Some(value[..end].to_string()).filter(|v| !v.is_empty());
        }
        from = start + needle.len();
    }
    None
}

/// The receipt a `deliver_sm` carries, if it is one: the TLVs
/// (`receipted_message_id`, `message_state`) first, else the text.
pub fn receipt(sm: &Sm) -> Option<DeliveryReceipt> {
    if sm.esm_class & 0x3C != ESM_RECEIPT {
        return None;
    }
    let text = String::from_utf8_lossy(&sm.short_message);
    let tlv_id = sm
        .tlv(tag::RECEIPTED_MESSAGE_ID)
        .map(|v| {
            let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
            String::from_utf8_lossy(&v[..end]).into_owned()
        })
        .filter(|s| !s.is_empty());
    let tlv_state = sm
        .tlv(tag::MESSAGE_STATE)
        .and_then(|v| v.first().copied())
        .map(state_word);
    let message_id = tlv_id.or_else(|| field(&text, "id"))?;
    let stat = tlv_state
        .map(str::to_string)
        .or_else(|| field(&text, "stat"))?;
    Some(DeliveryReceipt {
        message_id,
        stat,
        err: field(&text, "err"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip_and_bounds() {
        let pdu = encode(id::ENQUIRE_LINK, 0, 7, &[]);
        assert_eq!(pdu.len(), 16);
        assert_eq!(
            header(&pdu),
            Ok(Header {
                command_length: 16,
                command_id: id::ENQUIRE_LINK,
                command_status: 0,
                sequence: 7
            })
        );
        let mut short = pdu.clone();
        short[3] = 15;
        assert_eq!(header(&short), Err(PduError::Length(15)));
        let huge = encode(id::ENQUIRE_LINK, 0, 7, &[]);
        let mut huge = huge;
        huge[0] = 0x7F;
        assert!(matches!(header(&huge), Err(PduError::Length(_))));
        assert_eq!(header(&pdu[..10]), Err(PduError::Short));
    }

    #[test]
    fn bind_roundtrip_and_cut_fields() {
        let bind = Bind {
            system_id: "sendonce".into(),
            password: "secret".into(),
            system_type: "".into(),
        };
        let body = bind.body();
        // system_id, NUL, password, NUL, system_type NUL, version, ton, npi, range NUL
        assert_eq!(body.len(), 9 + 7 + 1 + 1 + 1 + 1 + 1);
        assert_eq!(body[body.len() - 4], 0x34);
        assert_eq!(Bind::decode(&body), Ok(bind));
        let long = Bind {
            system_id: "x".repeat(40),
            password: "p".repeat(20),
            system_type: "t".into(),
        };
        let got = Bind::decode(&long.body()).expect("decodes");
        assert_eq!(got.system_id.len(), 15);
        assert_eq!(got.password.len(), 8);
    }

    #[test]
    fn submit_roundtrip() {
        let s = Submit {
            source_addr: "+15550001".into(),
            destination_addr: "+14155550100".into(),
            esm_class: ESM_UDHI,
            registered_delivery: 1,
            data_coding: 8,
            short_message: vec![5, 0, 3, 9, 2, 1, 0, 0x41],
        };
        let got = Sm::decode(&s.body()).expect("decodes");
        assert_eq!(got.source_addr, "15550001");
        assert_eq!(got.destination_addr, "14155550100");
        assert_eq!(got.esm_class, ESM_UDHI);
        assert_eq!(got.registered_delivery, 1);
        assert_eq!(got.data_coding, 8);
        assert_eq!(got.short_message, s.short_message);
        assert!(got.tlvs.is_empty());
        // The body's TON/NPI: international, E.164.
        assert_eq!(&s.body()[1..3], &[1, 1]);
    }

    #[test]
    fn truncated_bodies_are_errors_not_panics() {
        let s = Submit {
            source_addr: "Acme".into(),
            destination_addr: "+14155550100".into(),
            esm_class: 0,
            registered_delivery: 1,
            data_coding: 0,
            short_message: b"hello".to_vec(),
        };
        let body = s.body();
        for n in 0..body.len() {
            assert!(Sm::decode(&body[..n]).is_err(), "{n}");
        }
        assert!(Sm::decode(&[0xFF; 40]).is_err());
        assert_eq!(resp_id(&[]), "");
        assert_eq!(resp_id(b"abc\0"), "abc");
    }

    fn deliver(esm_class: u8, text: &str, tlvs: &[(u16, &[u8])]) -> Sm {
        let mut body = Submit {
            source_addr: "+14155550100".into(),
            destination_addr: "Acme".into(),
            esm_class,
            registered_delivery: 0,
            data_coding: 0,
            short_message: text.as_bytes().to_vec(),
        }
        .body();
        for (tag, v) in tlvs {
            body.extend_from_slice(&tag.to_be_bytes());
            body.extend_from_slice(&(v.len() as u16).to_be_bytes());
            body.extend_from_slice(v);
        }
        Sm::decode(&body).expect("decodes")
    }

    #[test]
    fn receipts_from_text_and_tlvs() {
        let text = "id:0123abc sub:001 dlvrd:001 submit date:2601011200 done date:2601011201 stat:DELIVRD err:000 text:hello";
        assert_eq!(
            receipt(&deliver(ESM_RECEIPT, text, &[])),
            Some(DeliveryReceipt {
                message_id: "0123abc".into(),
                stat: "DELIVRD".into(),
                err: Some("000".into()),
            })
        );
        // The TLVs win over the text.
        let r = receipt(&deliver(
            ESM_RECEIPT,
            "id:zzz stat:ENROUTE",
            &[(tag::RECEIPTED_MESSAGE_ID, b"m-42\0"), (tag::MESSAGE_STATE, &[5])],
        ))
        .expect("a receipt");
        assert_eq!((r.message_id.as_str(), r.stat.as_str()), ("m-42", "UNDELIV"));
        // Not a receipt: an MO message.
        assert_eq!(receipt(&deliver(0, text, &[])), None);
        // A receipt without an id: none.
        assert_eq!(receipt(&deliver(ESM_RECEIPT, "stat:DELIVRD", &[])), None);
        // "submit date:" is not "id:".
        assert_eq!(
            field("xdate:2601 id:7 stat:X", "date"),
            None,
            "only whole words"
        );
        assert_eq!(field("xid:1 id:7", "id").as_deref(), Some("7"));
    }

    #[test]
    fn tlvs_that_run_past_the_end_are_refused() {
        let mut body = Submit {
            source_addr: "1".into(),
            destination_addr: "2".into(),
            esm_class: ESM_RECEIPT,
            registered_delivery: 0,
            data_coding: 0,
            short_message: vec![],
        }
        .body();
        body.extend_from_slice(&[0x00, 0x1E, 0x00, 0x10, b'a']);
        assert_eq!(Sm::decode(&body), Err(PduError::Short));
    }
}
