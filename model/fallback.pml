/*
 * fallback.pml: a Promela model of a verification's code going through its
 * channels in order (one channel at a time), beside sendonce.pml (which
 * models one message's exactly-once send in detail).
 *
 * Run scripts/model-check.sh (the `fallback-*` runs); docs/model.md says
 * what is modelled, how it maps to the Rust code, and the results.
 *
 * Actors
 *   Deliver(k)  the delivery of step k's message (Deliverer::run): claims
 *               it (Scheduler, Store::claim_due; the first run holds the
 *               lease its insert took), checks it right before the call in
 *               one step with the request (FallbackStore::guard_send), calls
 *               the channel's provider, writes the answer fenced on its
 *               lease. It may crash at any step: the lease stays until it
 *               runs out, and whoever claims the message next with an
 *               attempt open only ever looks it up (Provider::reconcile).
 *   Worker(i)   the fallback pass of instance i (verify::fallback::Fallbacks):
 *               reads a step's row with its message and verification
 *               (FallbackStore::due_fallbacks), decides on that read
 *               (fallback::next), asks the provider what became of the
 *               message (Provider::delivery_status), revokes it
 *               (Provider::revoke), then moves to the next step in one
 *               transaction that reads the row, the verification and the
 *               message fresh (FallbackStore::fall_back, domain::stop). It may
 *               crash between any two of those.
 *   Client      ends the verification once (a check approving it, a cancel,
 *               its expiry), in one transaction that stops its unsent
 *               messages (Driver::stop_unsent, domain::stop::for_end).
 *   Phone       the provider's side: a message made reaches the phone (or
 *               is revoked first), and its report comes back, at any moment.
 * Time is not modelled: every due time can come at any moment (a retry, a
 * recheck, a fallback's `fallback_after_seconds`), which covers every order
 * of events the real timers allow.
 *
 * Properties (asserted; none given: all)
 *   CHECK_CHANNEL  one channel at a time: no provider call of step k starts
 *                  once step k+1's message was written, and step k+1 is
 *                  written only while step k's message is not delivered
 *   CHECK_END      no provider call starts after the verification ended
 *   CHECK_ONCE     each step's provider makes at most one message (the
 *                  channel's provider de-duplicates nothing)
 *   CHECK_PHONE    with a revoke that withdraws a message not yet on the
 *                  phone (as the Gateway describes it), the phone never
 *                  has the code on two channels: step k+1 is written only
 *                  while step k's message has not reached the phone
 *
 * Switches
 *   NCH=2|3        steps (channels) in the order (default 2)
 *   NW=1|2         instances running the fallback pass (default 1)
 *   MAXRUN, MAXPASS  delivery runs per message after its first (default 1),
 *                  fallback passes per instance (default 2)
 * Today's rules, put back (each must give a counterexample)
 *   BUG_CANCEL_NO_TOKEN  hole 1: the move cancels a message waiting for a
 *                        retry only while it has no request id; with one it
 *                        is only revoked, and its retry still goes
 *   BUG_STALE_READ       hole 2: the move decides on the message as read
 *                        before the revoke, and its write does not read it
 *                        again
 *   BUG_RESEND           hole 3: an ambiguous send is retried with the same
 *                        request id, as if the provider de-duplicated
 *   BUG_ASK_FIRST        the provider is asked before the revoke: a message
 *                        that reaches the phone in between goes unseen
 *   BUG_UNFENCED_MOVE    the move does not check that the message is as the
 *                        pass read it: a pass that read it waiting for a
 *                        retry (nothing to revoke, nothing to ask) moves
 *                        on after an attempt sent it meanwhile
 *   BUG_NO_GUARD         nothing checks the message right before the call:
 *                        a delivery that claimed it before the end (or the
 *                        move) calls after it
 */

#ifndef NCH
#define NCH 2
#endif
#ifndef NW
#define NW 1
#endif
#ifndef MAXRUN
#define MAXRUN 1      /* delivery runs per step message after its first */
#endif
#ifndef MAXPASS
#define MAXPASS 2     /* fallback passes per instance */
#endif

#if !defined(CHECK_CHANNEL) && !defined(CHECK_END) && !defined(CHECK_ONCE) && !defined(CHECK_PHONE)
#define CHECK_CHANNEL
#define CHECK_END
#define CHECK_ONCE
#define CHECK_PHONE
#endif

mtype = { NONE, PROC, SENT, FAILED, UNKNOWN, DELIV, UNDELIV, CANCELED };
mtype = { WAITING, SDELIVERED, MOVED, ENDED };

bool ended;              /* the verification left `pending` */

/* Step k's message, as the database has it. */
mtype st[NCH];           /* status */
byte lease[NCH];         /* 0: none; else the run holding it */
bool open[NCH];          /* the latest attempt has no recorded answer */
bool maybe[NCH];         /* an earlier attempt may have gone out */
bool expired[NCH];       /* stopped: its validity ended (no call after) */
bool tok[NCH];           /* its provider's first call handed out a token */
byte att[NCH];           /* attempts started (the claim of a due message) */
/* The step's row (verification_fallbacks): the last step has one too,
 * for the revoke at the end. */
mtype row[NCH];

/* The provider's side of step k. */
byte phone[NCH];         /* messages its provider made */
bool reached[NCH];       /* one of them reached the phone (delivered) */
bool revoked[NCH];       /* revoked before it reached the phone */

#define CANCELABLE(k) (st[k] == PROC && lease[k] == 0 && !open[k] && !maybe[k])
/* Neither delivered nor certainly undelivered. */
#define SILENT(x) (x != DELIV && x != FAILED && x != CANCELED && x != UNDELIV)
/* A step's row with something to do, once its message exists. */
#define OPENROW(k) (k < NCH && st[k] != NONE && (row[k] == WAITING || row[k] == SDELIVERED))

/* A provider call that puts a message out, checked in the same step. */
inline call_made(k) {
  phone[k]++;
#ifdef CHECK_ONCE
  assert(phone[k] <= 1);
#endif
#ifdef CHECK_END
  assert(!ended);
#endif
#ifdef CHECK_CHANNEL
  j = k + 1;
  do
  :: j < NCH -> assert(st[j] == NONE); j++
  :: else -> break
  od;
#endif
  printf("MSC: step %d: a message on the phone\n", k)
}

/* A fenced write of run `me` that ends message k. */
inline finish(k, status) {
  if
  :: lease[k] == me && st[k] == PROC ->
     st[k] = status; lease[k] = 0; open[k] = 0;
     printf("MSC: step %d ends %e\n", k, status)
  :: else -> skip
  fi
}

proctype Deliver(byte k) {
  byte me, runs, j;
  bool snap_exp;
endwait:
  (st[k] != NONE);
  /* The insert started attempt 1 under this run's lease. */
  me = 1;
  goto go;
endclaim:
  if
  :: runs >= MAXRUN || st[k] != PROC -> goto done
  :: atomic { runs < MAXRUN && st[k] == PROC && lease[k] == 0 ->
       runs++; me = runs + 1; lease[k] = me; att[k]++;
       printf("MSC: step %d claimed by run %d\n", k, me);
       snap_exp = expired[k];
       if
       :: open[k] -> goto lookup    /* an attempt left open: only asked */
       :: else -> open[k] = 1       /* a new attempt starts */
       fi }
  fi;
go:
  /* First call (checkSendAbility): the request id, written with the
   * message (fenced); or it fails, nothing sent, and a retry is due. */
  if
  :: !tok[k] ->
     if
     :: atomic { lease[k] == me -> tok[k] = 1 }
     :: goto retry
     fi
  :: else -> skip
  fi;
  /* The check right before the call, in one step with the request. */
  atomic {
    lease[k] == me && st[k] == PROC;
#ifdef BUG_NO_GUARD
    if
    :: snap_exp -> finish(k, CANCELED); goto endclaim
    :: else -> skip
    fi;
#else
    if
    :: expired[k] ->
       if
       :: maybe[k] -> finish(k, UNKNOWN)
       :: else -> finish(k, CANCELED)
       fi;
       goto endclaim
    :: else -> skip
    fi;
#endif
    /* The provider's answer: accepted, not sent (retry), refused, or no
     * answer (it may or may not have made one). */
    if
    :: call_made(k); goto accepted
    :: goto retry
    :: goto rejected
    :: call_made(k); goto ambiguous
    :: goto ambiguous
    fi
  }
accepted:
  atomic { finish(k, SENT) };
  goto endclaim;
retry:
  atomic {
    if
    :: lease[k] == me && st[k] == PROC -> lease[k] = 0; open[k] = 0;
       printf("MSC: step %d: not sent, a retry due\n", k)
    :: else -> skip
    fi };
  goto endclaim;
rejected:
  atomic { finish(k, FAILED) };
  goto endclaim;
ambiguous:
  if :: true -> skip :: goto crashed fi;
#ifdef BUG_RESEND
  /* Retried with the same request id, as if the provider de-duplicated. */
  atomic {
    if
    :: lease[k] == me && st[k] == PROC -> lease[k] = 0; open[k] = 0; maybe[k] = 1
    :: else -> skip
    fi };
  goto endclaim;
#endif
lookup:
  /* Looked up by its request id (checkVerificationStatus): sent if the
   * provider made it; else asked again later, or `unknown` at the
   * deadline. Never sent again. */
  atomic {
    if
    :: lease[k] == me && st[k] == PROC && phone[k] > 0 -> finish(k, SENT)
    :: lease[k] == me && st[k] == PROC && phone[k] == 0 ->
       if
       :: lease[k] = 0; maybe[k] = 1   /* recheck later, attempt open */
       :: finish(k, UNKNOWN)
       fi
    :: else -> skip
    fi };
  goto endclaim;
crashed:
  printf("MSC: step %d: run %d crashes\n", k, me);
  /* Its lease runs out (takeover allowed). */
  atomic { lease[k] == me -> lease[k] = 0 };
  goto endclaim;
done:
  skip
}

/* The next step's message, inserted leased by its first run. */
inline insert_next(k) {
#ifdef CHECK_CHANNEL
  assert(st[k] != DELIV);
#endif
#ifdef CHECK_PHONE
  assert(!reached[k]);
#endif
  st[k + 1] = PROC; lease[k + 1] = 1; open[k + 1] = 1;
  printf("MSC: step %d written\n", k + 1)
}

/* revokeVerificationMessage, best effort: it withdraws a message that has
 * not reached the phone (and nothing else). */
inline revoke(k) {
  if
  :: may_arrive -> atomic { if :: !reached[k] -> revoked[k] = 1 :: else -> skip fi };
     printf("MSC: step %d revoked\n", k)
  :: else -> skip
  fi
}

/* checkVerificationStatus: a delivery it shows ends the row delivered
 * (whatever the message's status can show), and is recorded as a report. */
inline ask(k) {
  if
  :: may_arrive ->
     atomic {
       if
       :: reached[k] ->
          if :: st[k] == SENT -> st[k] = DELIV :: else -> skip fi;
          if :: row[k] == WAITING -> row[k] = SDELIVERED :: else -> skip fi;
          printf("MSC: step %d: asked, delivered\n", k)
       :: else -> skip
       fi }
  :: else -> skip
  fi
}

proctype Worker(byte i) {
  byte k, passes, j;
  mtype s_st, s_row;
  byte s_att;
  bool s_leased, s_ended, may_arrive;
endpass:
  /* A row with something to do, read with its message (due_fallbacks). */
  atomic {
    if
    :: passes >= MAXPASS -> goto done
    :: passes < MAXPASS && OPENROW(0) -> k = 0
    :: passes < MAXPASS && OPENROW(1) -> k = 1
#if NCH > 2
    :: passes < MAXPASS && OPENROW(2) -> k = 2
#endif
    fi;
    passes++;
    s_st = st[k]; s_row = row[k]; s_leased = (lease[k] != 0); s_att = att[k];
    s_ended = ended;
    may_arrive = tok[k] && s_st != FAILED && s_st != CANCELED && s_st != UNDELIV;
    printf("MSC: pass %d reads step %d (%e)\n", i, k, s_st)
  };
  /* fallback::next, on the row as read. */
  if
  :: s_ended ->
     if
     :: s_leased -> goto endpass
     :: else -> goto end_step
     fi
  :: !s_ended && s_row == SDELIVERED -> goto endpass
  :: !s_ended && s_row == WAITING && s_st == DELIV ->
     atomic { if :: row[k] == WAITING -> row[k] = SDELIVERED :: else -> skip fi };
     goto endpass
  :: !s_ended && s_row == WAITING && (s_st == FAILED || s_st == CANCELED || s_st == UNDELIV) ->
     if
     :: k + 1 < NCH -> goto move
     :: else -> goto end_step
     fi
  :: !s_ended && s_row == WAITING && SILENT(s_st) && s_leased -> goto endpass
  /* Due (fallback_after_seconds passed): at any moment. */
  :: !s_ended && s_row == WAITING && SILENT(s_st) && !s_leased && k + 1 < NCH ->
#ifdef BUG_ASK_FIRST
     ask(k);
     if :: true -> skip :: goto endpass fi;   /* crash */
     revoke(k);
#elif defined(BUG_STALE_READ)
     revoke(k);
     if :: true -> skip :: goto endpass fi;   /* crash */
#else
     /* Revoke first, then ask: a message that reached the phone before
      * the revoke is seen by the answer; one revoked first never does. */
     revoke(k);
     if :: true -> skip :: goto endpass fi;   /* crash */
     ask(k);
#endif
     if :: row[k] != WAITING -> goto endpass :: else -> skip fi;
     goto move
  :: else -> goto endpass
  fi;
move:
  /* FallbackStore::fall_back: one transaction. */
  atomic {
    if
    :: ended || row[k] != WAITING -> skip   /* NotNow */
#ifdef BUG_STALE_READ
    /* Decided on the message as read before the revoke (and, as then,
     * nothing asked): its status is not read again. */
    :: else ->
       if
       :: s_st == DELIV -> row[k] = SDELIVERED
       :: else ->
          if
          :: CANCELABLE(k) -> st[k] = CANCELED
          :: !CANCELABLE(k) && st[k] == PROC && lease[k] == 0 -> expired[k] = 1
          :: else -> skip
          fi;
          row[k] = MOVED; insert_next(k)
       fi
#else
    :: else ->
       if
       :: st[k] == DELIV -> row[k] = SDELIVERED
       :: st[k] != DELIV && lease[k] != 0 && st[k] == PROC -> skip   /* Busy */
#ifndef BUG_UNFENCED_MOVE
       /* Moved on since the pass read it (an attempt made, a report):
        * the revoke and the question were about an older message. */
       :: st[k] != DELIV && !(lease[k] != 0 && st[k] == PROC) && (st[k] != s_st || att[k] != s_att) -> skip
#endif
       :: else ->
#ifdef BUG_CANCEL_NO_TOKEN
          if
          :: CANCELABLE(k) && !tok[k] -> st[k] = CANCELED
          :: else -> skip
          fi;
#else
          if
          :: CANCELABLE(k) -> st[k] = CANCELED
          :: !CANCELABLE(k) && st[k] == PROC -> expired[k] = 1
          :: else -> skip
          fi;
#endif
          row[k] = MOVED; insert_next(k)
       fi
#endif
    fi };
  goto endpass;
end_step:
  revoke(k);
  atomic {
    if
    :: row[k] == WAITING || row[k] == SDELIVERED ->
#ifdef BUG_CANCEL_NO_TOKEN
       if
       :: CANCELABLE(k) && !tok[k] -> st[k] = CANCELED
       :: else -> skip
       fi;
#endif
       row[k] = ENDED
    :: else -> skip
    fi };
  goto endpass;
done:
  skip
}

proctype Client() {
  byte k;
  if
  :: skip
  :: atomic {
       ended = 1;
       printf("MSC: the verification ends\n");
#if !defined(BUG_CANCEL_NO_TOKEN)
       /* Its unsent messages stopped in the same transaction. */
       k = 0;
       do
       :: k < NCH ->
          if
          :: CANCELABLE(k) -> st[k] = CANCELED
          :: !CANCELABLE(k) && st[k] == PROC -> expired[k] = 1
          :: else -> skip
          fi;
          k++
       :: else -> break
       od
#endif
     }
  fi
}

proctype Phone() {
  byte k;
endphone:
  do
  /* A message made reaches the phone, unless revoked first. */
  :: atomic { phone[0] > 0 && !revoked[0] && !reached[0] -> reached[0] = 1;
       printf("MSC: step 0: on the phone\n") }
  :: atomic { NCH > 1 && phone[1] > 0 && !revoked[1] && !reached[1] -> reached[1] = 1;
       printf("MSC: step 1: on the phone\n") }
#if NCH > 2
  :: atomic { phone[2] > 0 && !revoked[2] && !reached[2] -> reached[2] = 1;
       printf("MSC: step 2: on the phone\n") }
#endif
  /* Its report: delivered makes a sent message delivered. */
  :: atomic { reached[0] && st[0] == SENT -> st[0] = DELIV;
       printf("MSC: step 0: reported delivered\n") }
  :: atomic { NCH > 1 && reached[1] && st[1] == SENT -> st[1] = DELIV;
       printf("MSC: step 1: reported delivered\n") }
#if NCH > 2
  :: atomic { reached[2] && st[2] == SENT -> st[2] = DELIV;
       printf("MSC: step 2: reported delivered\n") }
#endif
  od
}

init {
  byte k;
  atomic {
    k = 0;
    do
    :: k < NCH -> st[k] = NONE; row[k] = WAITING; k++
    :: else -> break
    od;
    /* The start: step 0's message inserted, leased, attempt 1 started. */
    st[0] = PROC; lease[0] = 1; open[0] = 1;
    k = 0;
    do
    :: k < NCH -> run Deliver(k); k++
    :: else -> break
    od;
    k = 0;
    do
    :: k < NW -> run Worker(k); k++
    :: else -> break
    od;
    run Client();
    run Phone()
  }
}
