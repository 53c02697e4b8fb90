// A test SMSC: the npm `smpp` package's server (pinned in package.json,
// installed by scripts/smsc.sh), scripted by the Rust tests over stdin and
// reporting over stdout, one JSON object a line. It never de-duplicates:
// every submit_sm it is sent is reported, with what it answered.
//
//   node smsc.js [--port N] [--tls-key FILE --tls-cert FILE]
//
// Out (stdout): {"event":"listening","port":N}
//   {"event":"bind","session":S,"system_id":..,"ok":bool}
//   {"event":"submit","session":S,"seq":..,"source":..,"dest":..,
//    "data_coding":..,"esm_class":..,"registered_delivery":..,
//    "udh":{"ref":..,"total":..,"part":..}|null,"short_message":"hex",
//    "text":"decoded body part","answer":"ok"|"0x..."|"silent"|"drop",
//    "message_id":..|null,"at_ms":wall clock,"outstanding":n}
//   {"event":"deliver_sm_resp","session":S,"seq":..,"status":..}
//   {"event":"closed","session":S,"at_ms":wall clock}
//   {"event":"done","cmd":n}  after each command
// In (stdin):
//   {"cmd":"config","password":..,"answer":"ok"|"0x58"|..|"silent"|"drop","delay_ms":n,
//    "faults":[["0x58",0.05],["silent",0.01],..]}
//     answers: "ok" accepts (a message_id); "0x.." answers that status;
//     "silent" takes the submit and never answers; "drop" takes it and
//     destroys its session without answering (dropped mid-window).
//     "faults": for each submit with no queued answer, each answer of the
//     list is drawn with its probability, else the configured one.
//   {"cmd":"queue","answers":["0x58","ok",..]}  one-shot answers first
//   {"cmd":"drop"}        destroys every session
//   {"cmd":"deliver","message_id":..,"stat":"DELIVRD","err":"000"}
//   {"cmd":"stop"}        exits
'use strict';
const fs = require('fs');
const readline = require('readline');
const smpp = require('smpp');
const { PDU } = require('smpp/lib/pdu');

// Keep each PDU's bytes: the package decodes short_message by data_coding,
// and the tests want what was on the wire.
const fromBuffer = PDU.prototype.fromBuffer;
PDU.prototype.fromBuffer = function (buffer) {
  this._raw = Buffer.from(buffer);
  return fromBuffer.call(this, buffer);
};

const args = process.argv.slice(2);
const arg = (name) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};
const config = { password: 'secret', answer: 'ok', delay_ms: 0, faults: [] };
const queue = [];
const sessions = new Set();
let nextSession = 0;
let nextId = 0;

const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');

// submit_sm's mandatory fields from the raw PDU (SMPP v3.4 4.4.1).
function readSubmit(raw) {
  let o = 16;
  const cstr = () => {
    const end = raw.indexOf(0, o);
    const s = raw.slice(o, end).toString('latin1');
    o = end + 1;
    return s;
  };
  cstr(); // service_type
  o += 2;
  const source = cstr();
  o += 2;
  const dest = cstr();
  const esm_class = raw[o++];
  o += 2; // protocol_id, priority_flag
  cstr(); // schedule_delivery_time
  cstr(); // validity_period
  const registered_delivery = raw[o++];
  o += 1; // replace_if_present_flag
  const data_coding = raw[o++];
  o += 1; // sm_default_msg_id
  const len = raw[o++];
  const sm = raw.slice(o, o + len);
  let udh = null;
  let body = sm;
  if (esm_class & 0x40 && sm.length > 0) {
    const udhl = sm[0];
    body = sm.slice(1 + udhl);
    for (let i = 1; i < 1 + udhl; ) {
      const iei = sm[i], l = sm[i + 1];
      if (iei === 0x00) udh = { ref: sm[i + 2], total: sm[i + 3], part: sm[i + 4] };
      if (iei === 0x08) udh = { ref: sm.readUInt16BE(i + 2), total: sm[i + 4], part: sm[i + 5] };
      i += 2 + l;
    }
  }
  let text;
  if (data_coding === 8) {
    const b = Buffer.from(body);
    b.swap16();
    text = b.toString('utf16le');
  } else {
    text = body.toString('latin1');
  }
  return { source, dest, esm_class, registered_delivery, data_coding, udh, short_message: sm.toString('hex'), text };
}

// The answer to a submit: one of the faults drawn by its probability, else
// the configured answer.
function draw() {
  let roll = Math.random();
  for (const [answer, p] of config.faults) {
    if (roll < p) return answer;
    roll -= p;
  }
  return config.answer;
}

function onSession(session) {
  const id = ++nextSession;
  session.id = id;
  session.outstanding = 0;
  sessions.add(session);
  session.on('error', () => {});
  session.on('close', () => {
    sessions.delete(session);
    out({ event: 'closed', session: id, at_ms: Date.now() });
  });
  session.on('bind_transceiver', (pdu) => {
    const ok = pdu.password === config.password;
    out({ event: 'bind', session: id, system_id: pdu.system_id, ok });
    session.send(pdu.response({ command_status: ok ? 0 : smpp.ESME_RINVPASWD, system_id: 'smsc' }));
    if (ok) session.bound = true;
    else setImmediate(() => session.close());
  });
  session.on('enquire_link', (pdu) => session.send(pdu.response()));
  session.on('unbind', (pdu) => {
    session.send(pdu.response());
    session.close();
  });
  session.on('deliver_sm_resp', (pdu) => {
    out({ event: 'deliver_sm_resp', session: id, seq: pdu.sequence_number, status: pdu.command_status });
  });
  session.on('submit_sm', (pdu) => {
    const s = readSubmit(pdu._raw);
    const answer = queue.length ? queue.shift() : draw();
    session.outstanding += 1;
    const ev = Object.assign({ event: 'submit', session: id, seq: pdu.sequence_number }, s, {
      answer, message_id: null, at_ms: Date.now(), outstanding: session.outstanding,
    });
    if (answer === 'silent') {
      out(ev);
      return;
    }
    if (answer === 'drop') {
      out(ev);
      session.destroy();
      return;
    }
    const status = answer === 'ok' ? 0 : parseInt(answer, 16);
    if (status === 0) ev.message_id = 'smsc-' + (++nextId);
    out(ev);
    const reply = () => {
      session.outstanding -= 1;
      session.send(pdu.response(status === 0 ? { message_id: ev.message_id } : { command_status: status }));
    };
    if (config.delay_ms > 0) setTimeout(reply, config.delay_ms);
    else reply();
  });
}

const tls = arg('--tls-key') ? { key: fs.readFileSync(arg('--tls-key')), cert: fs.readFileSync(arg('--tls-cert')) } : {};
const server = smpp.createServer(tls, onSession);
server.listen(Number(arg('--port') || 0), '127.0.0.1', () => {
  out({ event: 'listening', port: server.address().port });
});

let cmds = 0;
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  if (!line.trim()) return;
  const c = JSON.parse(line);
  cmds += 1;
  switch (c.cmd) {
    case 'config':
      for (const k of ['password', 'answer', 'delay_ms', 'faults']) if (k in c) config[k] = c[k];
      break;
    case 'queue':
      queue.push(...c.answers);
      break;
    case 'drop':
      for (const s of sessions) s.destroy();
      break;
    case 'deliver': {
      const text = `id:${c.message_id} sub:001 dlvrd:001 submit date:2601011200 done date:2601011201 stat:${c.stat} err:${c.err || '000'} text:`;
      for (const s of sessions) {
        if (!s.bound) continue;
        s.deliver_sm({
          source_addr: c.source || '+14155550100',
          destination_addr: 'sendonce',
          esm_class: 0x04,
          data_coding: 0,
          short_message: Buffer.from(text, 'latin1'),
        });
        break;
      }
      break;
    }
    case 'stop':
      process.exit(0);
  }
  out({ event: 'done', cmd: cmds });
}).on('close', () => process.exit(0));
