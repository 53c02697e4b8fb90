/*
 * sendonce.pml: a Promela model of sendonce's exactly-once send protocol
 * (one logical send, one message on the phone).
 *
 * Run scripts/model-check.sh to check it; docs/model.md describes the
 * abstraction, the properties, the mapping to the Rust code and the results.
 *
 * Actors
 *   Inst(i)    an instance: the HTTP handler's claiming insert, the
 *              scheduler/rescuer (Scheduler::scan, Store::claim_due) and one
 *              delivery task at a time (Deliverer::run). At any await point
 *              it may crash (the task vanishes, its lease stays), pause (GC,
 *              SIGSTOP, VM freeze) or be shut down (SIGTERM); after a crash
 *              or a shutdown it starts again as a new incarnation.
 *   Provider   puts messages on the phone for the requests the instances
 *              wrote: Twilio (no de-duplication) and the http bridge
 *              (de-duplicates on the key, 409 while a request is in flight).
 *   Client     cancels the key once, at a moment of its choosing.
 *   Clock      real time.
 *   Each step below names the Rust function it stands for.
 *
 * Time
 *   Discrete ticks. Every process is urgent: the clock ticks only when no
 *   other step is possible (`timeout`), so time passes only while processes
 *   wait for it: a sleep, a pause, a wait for a send slot, a provider call.
 *   Times are stored relative to now and saturate, so the state space is
 *   finite without a horizon:
 *     row.lrem  lease_expires_at - now() on the DATABASE clock. The
 *               database clock may step forward by more than L at any
 *               moment: then every lease has 0 left (expired).
 *     row.drem  next_attempt_at - now on the instances' clock.
 *     age[i]    how long ago the task's last lease write started, on its
 *               own monotonic clock (Lease::written, Lease::age).
 *   One tick is half of LEASE_FRESHNESS (F = 2 ticks = 1 s), so a request
 *   written "less than one freshness after the last lease write" can still
 *   come after another instance's claim of that lease.
 *   The provider acts on a request only during the tick it was written in
 *   (T = 1 tick): a message it creates appears at some moment of that tick,
 *   possibly after it answered; an answer "at the timeout" comes at the next
 *   tick.
 *
 * Compile-time switches (all off by default)
 *   Properties (none given: all of the assertions)
 *     CHECK_ONCE      never two messages on the phone for one key
 *     CHECK_FINAL     a final answer never changes (asserted on every write)
 *     CHECK_NOFAIL    never failed/canceled for a key whose message exists
 *     CHECK_ATTRIB    a key is `sent` only under its own message's id
 *     PROGRESS        the progress build: no non-progress cycle (every
 *                     run ends, with every key final)
 *   Configuration
 *     ONE_PROVIDER    Twilio only (default: Twilio, then the http bridge)
 *     SIBLING         two keys with the same recipient and body, Twilio only
 *     NI=3            three instances (default 2)
 *     MAXCRASH, MAXPAUSE, MAXJUMP, MAXTERM   fault budgets (default 1 each)
 *     MAXATT          attempts (default 3)
 *     MAXFAULTS       faults of all kinds in one run (default 2)
 *     CONNECT=1|2     the request is written up to CONNECT ticks after the
 *                     local lease check (connection set-up inside the
 *                     provider call); a takeover waits T + F + CONNECT
 *     TWAIT=n         a takeover waits n ticks (TWAIT >= L: the takeovers
 *                     take the message from each other forever)
 *   Today's bugs, put back (each must give a counterexample)
 *     BUG_RELEASE_AT_ONCE    shutdown releases every lease at once (due now,
 *                            attempt still open); the claimer reconciles at once
 *     BUG_NO_TAKEOVER_WAIT   a takeover reconciles at once
 *     BUG_SLOT_AFTER_CHECK   the lease renewal and check come before the wait
 *                            for a send slot
 *     BUG_CANCEL_MAYBE_SENT  cancel ignores maybe_sent
 *     BUG_409_REJECTED       the bridge's 409 is classified as rejected
 *     BUG_RECONCILE_EARLY    an early ambiguous answer (5xx, reset) is
 *                            reconciled at once, while the provider may still
 *                            be creating the message
 *     BUG_DEDUP_NO_WAIT      a takeover on the de-duplicating bridge resends
 *                            at once (no wait, as there is no reconciliation)
 *   Ways to get the fixed design wrong (each gives a counterexample)
 *     BUG_RELEASE_INHERITED  shutdown releases at once a takeover that has not
 *                            reconciled yet, closing the previous owner's open
 *                            attempt as "never called"
 *     BUG_DEFER_UNBOUNDED    "ask again later" does not count against the
 *                            deadline (SIBLING: two rows defer to each other)
 *   The design's rules as first written (each gives a counterexample)
 *     FLAW_TAKEOVER_WAIT_T   a takeover waits the provider timeout T only
 *     FLAW_REMAINING_CHECK   the local check before a request is "remaining
 *                            lease >= T + 1 s" (not "last lease write < 1 s
 *                            ago")
 *     FLAW_SIBLING_INFLIGHT  a candidate is left alone only for a sibling
 *                            that is still `processing`
 *     FLAW_CONNECT_UNCOUNTED (with CONNECT) a takeover waits T + F only
 *   The clocks' assumption
 *     SUSPEND_STOPS_CLOCK    a pause is a suspend during which the instance's
 *                            monotonic clock stands still (CLOCK_MONOTONIC
 *                            does not count a system suspend)
 *   The documented residual window
 *     PAUSE_IN_WINDOW        a pause between the local lease check and the
 *                            write of the request
 */

/* ------------------------------------------------------------------ */
/* Configuration                                                       */
/* ------------------------------------------------------------------ */

#if !defined(CHECK_ONCE) && !defined(CHECK_FINAL) && !defined(CHECK_NOFAIL) && !defined(CHECK_ATTRIB)
#define CHECK_ONCE
#define CHECK_FINAL
#define CHECK_NOFAIL
#define CHECK_ATTRIB
#endif

#ifndef NI
#define NI 2
#endif

#ifdef SIBLING
#define NK 2            /* keys */
#define NP 1            /* providers: Twilio */
#else
#define NK 1
#ifdef ONE_PROVIDER
#define NP 1
#else
#define NP 2            /* Twilio (primary), then the http bridge */
#endif
#endif

#define F 2             /* LEASE_FRESHNESS: 1 s */
#define T 1             /* provider timeout (the provider acts for 1 tick) */
#define L 6             /* lease: the configuration's lease >= 2 T + 2 s */
#define RETRY_DELAY 1   /* a retry's longest due time (full jitter: 0 or 1) */
#define G 1             /* the shutdown grace period */

#ifndef MAXATT
#define MAXATT 3        /* attempts: RetryPolicy::max_attempts, the deadline */
#endif
#ifndef MAXCRASH
#define MAXCRASH 1
#endif
#ifndef MAXPAUSE
#define MAXPAUSE 1
#endif
#ifndef MAXJUMP
#define MAXJUMP 1
#endif
#ifndef MAXTERM
#define MAXTERM 1
#endif
#ifndef MAXFAULTS
#define MAXFAULTS 2     /* faults of all kinds together in one run */
#endif
#define NFAULTS (crashes + pauses + jumps + terms)

/* A takeover's wait before reconciling (on its own clock), and the local
   lease check right before a request is written. */
#ifndef CONNECT
#define CONNECT 0       /* longest connection set-up inside Provider::send */
#endif
#if defined(TWAIT)
#define TW TWAIT        /* a takeover wait given in ticks */
#elif defined(BUG_NO_TAKEOVER_WAIT)
#define TW 0
#elif defined(FLAW_TAKEOVER_WAIT_T)
#define TW T
#elif defined(FLAW_CONNECT_UNCOUNTED)
#define TW (T + F)
#else
#define TW (T + F + CONNECT)
#endif

#ifdef FLAW_REMAINING_CHECK
#define LEASE_OK  (L - age[me] >= T + F)   /* remaining >= T + 1 s */
#define AGECAP    (L - T - F + 1)
#else
#define LEASE_OK  (age[me] < F)            /* the last lease write is fresh */
#define AGECAP    F
#endif

/* ------------------------------------------------------------------ */
/* State                                                               */
/* ------------------------------------------------------------------ */

/* statuses */
#define S_NONE     0
#define S_SCHED    1
#define S_PROC     2
#define S_SENT     3
#define S_FAILED   4
#define S_UNKNOWN  5
#define S_CANCELED 6
#define FINAL(s)   ((s) >= S_SENT)

/* providers */
#define TWILIO 0        /* does not de-duplicate: reconcile */
#define HTTP   1        /* de-duplicates on the key (Idempotency-Key) */
#define DEDUPES(p) ((p) == HTTP)

/* Provider answers, answers of a reconciliation (Provider::reconcile and
   the owner check), and names for the traces. */
mtype = {
  accepted,             /* with the message id */
  rejected,             /* certainly not created */
  retryable,            /* retryable or refused: certainly not created */
  ambiguous,            /* created or not */
  conflict409,          /* bridge: a request with this key is in flight */
  found, not_found, cannot_tell,
  ask_again_later,      /* another row may own the candidate */
  twilio, bridge,
  sent, failed, unknown
};
#define A_ACC   accepted
#define A_REJ   rejected
#define A_RETRY retryable
#define A_AMB   ambiguous
#define A_409   conflict409
#define R_FOUND    found
#define R_NOTFOUND not_found
#define R_UNKNOWN  cannot_tell
#define R_DEFER    ask_again_later
#define PNAME(x)   ((x) == HTTP -> bridge : twilio)
#define SNAME(x)   ((x) == S_SENT -> sent : ((x) == S_FAILED -> failed : unknown))

#define NOKEY 255

/* One row of `messages` (with whether its last attempt row is open). */
typedef Row {
  byte st;              /* status */
  byte tok;             /* lease_token: 0 none, else the holder's instance + 1 */
  byte lrem;            /* lease left on the database clock; 0: expired */
  bit  due;             /* next_attempt_at is set */
  byte drem;            /* ticks until next_attempt_at */
  bit  aopen;           /* an attempt with no recorded answer */
  bit  maybe;           /* maybe_sent */
  byte mid;             /* provider_message_id: 0 none, else MSGID */
  byte prov;            /* messages.provider */
  byte natt;            /* attempts */
}
Row row[NK];

/* Ghost: messages on the phone, per provider and key. */
byte made[NP * NK];
#define MSGID(p, k) ((p) * NK + (k) + 1)
#if NP == 2
#define MSGS(k) (made[k] + made[NK + (k)])
#else
#define MSGS(k) (made[k])
#endif

/* The request an instance last wrote to a provider (one per instance: a
   restarted instance writes again only once its previous request is over). */
typedef Req {
  bit  ph;              /* the provider still acts on it (this tick) */
  byte key;
  byte prov;
  bit  mk;              /* it will put a message on the phone this tick */
  mtype ans;            /* the answer the caller gets */
  bit  late;            /* the answer comes at the timeout, else at once */
}
Req rq[NI];

byte slp[NI];           /* exact sleeps (ticks left) */
bit  wt[NI];            /* waits of any length: the clock ends them */
byte age[NI];           /* ticks since the task's last lease write started */
bit  term[NI];          /* SIGTERM received: no more claims */
bit  stop[NI];          /* the grace period is over: stop the task */
byte grace[NI];
bit  jumpw;             /* the database clock steps in this tick */
byte crashes, pauses, jumps, terms;   /* faults so far */
byte live;              /* instance and client processes still running */
bit  waited;            /* a wait of any length went on through the last tick */
#ifdef SUSPEND_STOPS_CLOCK
bit  frozen[NI];        /* suspended: its monotonic clock stands still */
#endif
byte ti;                /* scratch (always 0 between steps) */

#if NK == 1
#define ALL_FINAL FINAL(row[0].st)
#else
#define ALL_FINAL (FINAL(row[0].st) && FINAL(row[1].st))
#endif

/* Store::claim_due's WHERE: due and unleased, or leased and expired on the
   database clock; or scheduled and due. */
#define CLAIMABLE(kk) ((row[kk].st == S_PROC && \
                        ((row[kk].tok == 0 && row[kk].due && row[kk].drem == 0) || \
                         (row[kk].tok != 0 && row[kk].lrem == 0))) || \
                       (row[kk].st == S_SCHED && row[kk].due && row[kk].drem == 0))
#if NK == 1
#define ANY_CLAIMABLE CLAIMABLE(0)
#else
#define ANY_CLAIMABLE (CLAIMABLE(0) || CLAIMABLE(1))
#endif

/* ------------------------------------------------------------------ */
/* Property checks                                                     */
/* ------------------------------------------------------------------ */

/* Before every write to a row: a final row is never written again. */
inline WRITE_CHECK(kk) {
#ifdef CHECK_FINAL
  assert(!FINAL(row[kk].st))
#else
  skip
#endif
}

/* The one place a status (and the provider id) is written. */
inline SET_STATUS(kk, s, id) {
  WRITE_CHECK(kk);
#ifdef CHECK_FINAL
  assert(row[kk].mid == 0);         /* a provider id is never replaced */
#endif
#ifdef CHECK_NOFAIL
  assert(!((s) == S_FAILED || (s) == S_CANCELED) || MSGS(kk) == 0);
#endif
#ifdef CHECK_ATTRIB
  /* sent only under an existing message of its own key */
  assert((s) != S_SENT || ((id) != 0 && ((id) - 1) % NK == kk && made[(id) - 1] > 0));
#endif
  row[kk].st = s;
  row[kk].mid = id
}

/* ------------------------------------------------------------------ */
/* Time                                                                */
/* ------------------------------------------------------------------ */

/* One tick, when no other step is possible: countdowns move, leases age on
   the database clock, every provider call of the last tick is over (T),
   waits of any length may end, and the database clock may step forward in
   the new tick. */
active proctype Clock() {
end:
  do
  :: atomic { timeout && live > 0 ->
       printf("MSC: ---- tick\n");
       ti = 0;
       do
       :: ti < NI ->
          if :: slp[ti] > 0 -> slp[ti]-- :: else -> skip fi;
#ifdef SUSPEND_STOPS_CLOCK
          if :: age[ti] < AGECAP && !frozen[ti] -> age[ti]++ :: else -> skip fi;
#else
          if :: age[ti] < AGECAP -> age[ti]++ :: else -> skip fi;
#endif
          if
          :: grace[ti] > 0 ->
             grace[ti]--;
             if
          :: grace[ti] == 0 -> stop[ti] = 1; printf("MSC: i%d: the grace period is over\n", ti)
          :: else -> skip
          fi
          :: else -> skip
          fi;
          assert(!rq[ti].mk);       /* (model sanity) the provider acted within T */
          rq[ti].ph = 0;
          if
          :: wt[ti] ->
             if
             :: wt[ti] = 0
#ifdef PROGRESS
             :: waited = 1          /* the wait goes on */
#else
             :: skip                /* the wait goes on */
#endif
             fi
          :: else -> skip
          fi;
          ti++
       :: else -> break
       od;
       ti = 0;
       do
       :: ti < NK ->
          if :: row[ti].lrem > 0 -> row[ti].lrem-- :: else -> skip fi;
          if :: row[ti].due && row[ti].drem > 0 -> row[ti].drem-- :: else -> skip fi;
          ti++
       :: else -> break
       od;
       jumpw = 0;
       if :: jumps < MAXJUMP && NFAULTS < MAXFAULTS -> if :: jumpw = 1 :: skip fi :: else -> skip fi;
       ti = 0
     }
#ifdef PROGRESS
  :: waited ->
     /* A wait of any length went on through a tick: progress, for the
        search for non-progress cycles (every such wait ends, so a cycle
        through here is no livelock). */
progress_wait:
     waited = 0
#endif
  od
}

inline SLEEP(n) {
  slp[me] = n;
  (slp[me] == 0 || stop[me]);       /* select! with the shutdown token */
  slp[me] = 0
}

/* Waiting for a send slot (Deliverer::acquire): none, or any length;
   stopped by the shutdown token. */
inline SLOTWAIT() {
  if
  :: skip
  :: atomic {
       printf("MSC: i%d waits for a send slot\n", me);
       wt[me] = 1
     };
     (!wt[me] || stop[me]);
     wt[me] = 0
  fi
}

/* A pause of the whole instance: any length (at least a tick). */
inline PAUSE() {
  atomic {
    pauses++;
    printf("MSC: i%d PAUSES\n", me);
#ifdef SUSPEND_STOPS_CLOCK
    frozen[me] = 1;
#endif
    wt[me] = 1
  };
  !wt[me];
#ifdef SUSPEND_STOPS_CLOCK
  frozen[me] = 0;
#endif
  printf("MSC: i%d resumes\n", me)
}

/* The database clock steps forward by more than L: every lease expires.
   Only a claim reads a lease's expiry (fenced writes test the token only,
   and every lease write sets the expiry afresh), so a step matters only
   through the claims after it: the model lets an idle scheduler make the
   step at any moment of a tick the clock chose, and then claim. */
inline DBJUMP() {
  jumps++; jumpw = 0;
  printf("MSC: DATABASE CLOCK STEPS FORWARD: every lease expires\n");
  row[0].lrem = 0;
#if NK > 1
  row[1].lrem = 0;
#endif
}
#define LEASED(kk) (row[kk].st == S_PROC && row[kk].tok != 0)
#if NK == 1
#define ANY_LEASED LEASED(0)
#else
#define ANY_LEASED (LEASED(0) || LEASED(1))
#endif

/* An await point of a delivery task: the instance may crash, pause, get
   SIGTERM or see its grace period end. A stopped task stops here. */
inline STEP() {
  atomic {
    do
    :: break
    :: crashes < MAXCRASH && NFAULTS < MAXFAULTS ->
       crashes++; printf("MSC: i%d CRASHES\n", me); goto crashed
    :: pauses < MAXPAUSE && NFAULTS < MAXFAULTS -> PAUSE()
    :: terms < MAXTERM && !term[me] && NFAULTS < MAXFAULTS ->
       terms++; term[me] = 1; grace[me] = G; printf("MSC: i%d gets SIGTERM\n", me)
    :: term[me] && !stop[me] ->
       stop[me] = 1; printf("MSC: i%d: the grace period is over\n", me)
    od;
    if
    :: stop[me] -> goto stopping
    :: else -> skip
    fi
  }
}

/* ------------------------------------------------------------------ */
/* The provider                                                        */
/* ------------------------------------------------------------------ */

/* The provider's side of Provider::send: the message appears on the phone
   at some moment of the tick the request was written in. The http bridge
   puts at most one message per key on the phone. */
inline MAKE(i) {
  if
  :: DEDUPES(rq[i].prov) && made[rq[i].prov * NK + rq[i].key] > 0 -> skip
  :: else ->
     printf("MSC: %e PUTS A MESSAGE ON THE PHONE for key %d (request of i%d)\n",
            PNAME(rq[i].prov), rq[i].key, i);
#ifdef CHECK_ONCE
     assert(MSGS(rq[i].key) == 0);   /* never two messages for one key */
#endif
#ifdef CHECK_NOFAIL
     assert(row[rq[i].key].st != S_FAILED && row[rq[i].key].st != S_CANCELED);
#endif
     made[rq[i].prov * NK + rq[i].key]++
  fi;
  rq[i].mk = 0
}

proctype Provider() {
end:
  do
  :: atomic { rq[0].mk -> MAKE(0) }
  :: atomic { rq[1].mk -> MAKE(1) }
#if NI > 2
  :: atomic { rq[2].mk -> MAKE(2) }
#endif
  od
}

/* Another instance's request with this key still in flight at the bridge. */
#define INFL(j, kk) (me != j && rq[j].ph && rq[j].key == kk && rq[j].prov == HTTP)
#if NI > 2
#define OTHER_INFLIGHT(kk) (INFL(0, kk) || INFL(1, kk) || INFL(2, kk))
#else
#define OTHER_INFLIGHT(kk) (INFL(0, kk) || INFL(1, kk))
#endif

/* The request is written (Provider::send), and what the provider does with
   it. */
inline WRITE() {
  wrote = 1;
  rq[me].key = k; rq[me].prov = p; rq[me].ph = 1;
  rq[me].mk = 0; rq[me].late = 0;
  if
  :: DEDUPES(p) && made[p * NK + k] > 0 ->
     rq[me].ans = A_ACC; rq[me].ph = 0        /* the key's message, again */
  :: DEDUPES(p) && made[p * NK + k] == 0 && OTHER_INFLIGHT(k) ->
     rq[me].ans = A_409; rq[me].ph = 0        /* "I am acting on it" */
  :: else ->
     if
     :: rq[me].ans = A_ACC; rq[me].mk = 1
     :: rq[me].ans = A_REJ; rq[me].ph = 0
     :: rq[me].ans = A_RETRY; rq[me].ph = 0
     :: rq[me].ans = A_AMB; rq[me].mk = 1     /* 5xx or reset; created */
     :: rq[me].ans = A_AMB                    /* 5xx or reset; not created */
     :: DEDUPES(p) -> rq[me].ans = A_AMB; rq[me].mk = 1; rq[me].late = 1
                                              /* timeout; created */
     fi
     /* (A Twilio timeout is the early answer, later: its caller waits for
        the end of the call before reconciling either way.) */
  fi;
  if
  :: rq[me].mk ->
     printf("MSC: i%d WRITES THE REQUEST for key %d to %e (answer: %e; it will put a message on the phone)\n",
            me, k, PNAME(p), rq[me].ans)
  :: else ->
     printf("MSC: i%d WRITES THE REQUEST for key %d to %e (answer: %e; no message)\n",
            me, k, PNAME(p), rq[me].ans)
  fi
}

/* Deliverer::reconcile (Twilio): list the messages to this recipient with
   this body. Several: nobody can tell. One held by another row: not ours.
   One that another row may own: ask again later. Any lookup may fail. */
#if NK == 1
#define CANDS             (made[0])
#define HELD_BY_OTHER(id) false
#define MAY_OWN_OTHER     false
#else
#define CANDS             (made[0] + made[1])
#define HELD_BY_OTHER(id) (row[1 - k].mid == (id))
#ifdef FLAW_SIBLING_INFLIGHT
#define MAY_OWN_OTHER (row[1 - k].st == S_PROC && row[1 - k].mid == 0 && \
                       (row[1 - k].aopen || row[1 - k].maybe))
#else
#define MAY_OWN_OTHER (row[1 - k].mid == 0 && \
                       (row[1 - k].aopen || row[1 - k].maybe || row[1 - k].st == S_UNKNOWN))
#endif
#endif

inline RECONCILE() {
  atomic {
    if
    :: CANDS == 0 -> res = R_NOTFOUND
    :: CANDS >= 2 -> res = R_UNKNOWN
    :: CANDS == 1 ->
       if :: made[0] > 0 -> rk = 0 :: else -> rk = 1 fi;
       if
       :: HELD_BY_OTHER(MSGID(TWILIO, rk)) -> res = R_NOTFOUND
       :: else ->
          /* (the candidate's key rk is the model's knowledge, not the
             reconciler's: it sees a recipient and a body) */
          if
          :: MAY_OWN_OTHER -> res = R_DEFER
          :: else -> res = R_FOUND
          fi
       fi
    fi;
    if
    :: skip
    :: res = R_UNKNOWN              /* the lookup fails */
    fi;
    printf("MSC: i%d RECONCILES key %d: %e\n", me, k, res)
  }
}

/* ------------------------------------------------------------------ */
/* The store's fenced writes (store/postgres/messages.rs, routing.rs)   */
/* ------------------------------------------------------------------ */

#define MINE (row[k].tok == me + 1 && row[k].st == S_PROC)

/* Store::renew_lease */
inline RENEW() {
  atomic {
    if
    :: MINE -> WRITE_CHECK(k); row[k].lrem = L; age[me] = 0;
       printf("MSC: i%d renews its lease\n", me)
    :: else -> printf("MSC: i%d: renewal fenced out\n", me); goto lost
    fi
  }
}

/* Store::start_attempt: closes an open attempt as lost (maybe_sent), opens
   the next one, extends the lease. */
inline START_ATTEMPT() {
  atomic {
    if
    :: MINE ->
       WRITE_CHECK(k);
       row[k].natt++; row[k].maybe = row[k].maybe || row[k].aopen;
       row[k].aopen = 1; row[k].lrem = L; age[me] = 0;
       own = 1; wrote = 0;
       printf("MSC: i%d starts attempt %d\n", me, row[k].natt)
    :: else -> goto lost
    fi
  }
}

/* Store::finish (finish_one): the final write, fenced; the provider id is
   under a unique constraint. */
inline FINISH(s, id) {
  atomic {
    if
    :: MINE && ((id) == 0 || !HELD_BY_OTHER(id)) ->
       SET_STATUS(k, s, id);
       row[k].tok = 0; row[k].lrem = 0; row[k].aopen = 0;
       row[k].due = 0; row[k].drem = 0;
       printf("MSC: i%d FINISHES key %d: %e\n", me, k, SNAME(row[k].st));
       goto done
    :: else -> printf("MSC: i%d: final write fenced out\n", me); goto lost
    fi
  }
}

/* Store::reschedule: records the attempt, releases the lease, sets the due
   time. keep: the attempt stays open (ask the provider again later). */
inline RESCHEDULE(rm, keep) {
  atomic {
    if
    :: MINE ->
       WRITE_CHECK(k);
       row[k].tok = 0; row[k].lrem = 0;
       row[k].due = 1;
       if
       :: keep -> row[k].drem = RETRY_DELAY                 /* later */
       :: !keep -> row[k].drem = 0                          /* full jitter */
       :: !keep -> row[k].drem = RETRY_DELAY
       fi;
       row[k].maybe = row[k].maybe || (rm);
       row[k].aopen = keep;
#ifndef BUG_DEFER_UNBOUNDED
       if :: keep -> row[k].natt++ :: else -> skip fi;   /* counts against the deadline */
#endif
       printf("MSC: i%d reschedules key %d (maybe_sent %d)\n", me, k, row[k].maybe);
       goto done
    :: else -> printf("MSC: i%d: reschedule fenced out\n", me); goto lost
    fi
  }
}

/* RoutingStore::move_on: closes the answered attempt, moves the message to
   the next provider and starts the next attempt there. */
inline MOVE_ON() {
  atomic {
    if
    :: MINE ->
       WRITE_CHECK(k);
       row[k].prov = HTTP; row[k].natt++; row[k].aopen = 1;
       row[k].lrem = L; age[me] = 0;
       p = HTTP; own = 1; wrote = 0;
       printf("MSC: i%d moves key %d on to the bridge\n", me, k)
    :: else -> goto lost
    fi
  }
}

/* decide::retry_or_give_up. gm: the answer counts as maybe sent when giving
   up; rm: the attempt's outcome is ambiguous (reschedule's maybe_sent). */
inline RETRY(gm, rm) {
  if
  :: row[k].natt >= MAXATT ->
     FINISH(((row[k].maybe || (gm)) -> S_UNKNOWN : S_FAILED), 0)
  :: else -> RESCHEDULE(rm, 0)
  fi
}

/* route::route: on to the next provider only when this one certainly did
   not send it and nothing earlier may have been sent. */
inline RETRY_OR_MOVE(rm) {
  if
  :: NP > 1 && p == TWILIO && !row[k].maybe && row[k].natt < MAXATT ->
     MOVE_ON(); goto call
  :: else -> RETRY(0, rm)
  fi
}

/* "Ask again later": the attempt stays open, so whoever claims the message
   next reconciles before sending anything. */
inline DEFER() {
#ifdef BUG_DEFER_UNBOUNDED
  RESCHEDULE(1, 1)
#else
  if
  :: row[k].natt >= MAXATT -> FINISH(S_UNKNOWN, 0)   /* the deadline */
  :: else -> RESCHEDULE(1, 1)
  fi
#endif
}

/* ------------------------------------------------------------------ */
/* An instance                                                         */
/* ------------------------------------------------------------------ */

proctype Inst(byte me) {
  byte k = NOKEY;       /* the task's message */
  byte p;               /* the provider the task sends with */
  mtype res;
  byte rk;
  bit own;              /* the open attempt is this task's own */
  bit wrote;            /* this task wrote the open attempt's request */
  bit took;             /* claimed an expired lease with an open attempt */
  bit open0;            /* the claimed row had an open attempt */

  /* -- POST /messages: the claiming insert (Store::insert_message,
        PgStore::insert_one; schedule_one for a future send_at). Instance 0
        gets the request. A second request with the key (a client retry, on
        any instance) meets the unique constraint and replays: it changes
        no row, so it is left out (and the instances being alike, instance 0
        winning the insert is no loss). -------------------------------- */
#ifdef SIBLING
  k = me;
  if :: me >= NK -> goto scan :: else -> skip fi;
#else
  k = 0;
  if :: me > 0 -> goto scan :: else -> skip fi;
#endif
  atomic {
    if
    :: row[k].st == S_NONE ->
       if
       :: row[k].st = S_PROC; row[k].tok = me + 1; row[k].lrem = L;
          row[k].aopen = 1; row[k].natt = 1; row[k].prov = TWILIO;
          age[me] = 0; p = TWILIO; own = 1; wrote = 0;
          printf("MSC: i%d inserts key %d: processing, leased, attempt 1 open\n", me, k)
#ifndef SIBLING
       :: row[k].st = S_SCHED; row[k].due = 1; row[k].drem = 1;
          row[k].prov = TWILIO;
          printf("MSC: i%d inserts key %d: scheduled\n", me, k);
          goto scan
#endif
       fi
    :: else -> goto scan            /* the key is taken: a replay */
    fi
  }
  goto call;

restart:
  /* A new incarnation of the instance (after a crash or a shutdown). */
  atomic {
    term[me] = 0; stop[me] = 0; grace[me] = 0; slp[me] = 0; wt[me] = 0;
    printf("MSC: i%d starts again\n", me)
  };

scan:
  /* -- Scheduler::run / scan: Store::claim_due (FOR UPDATE SKIP LOCKED);
        a scheduler claims as soon as a row is claimable (a late scan is a
        pause). -------------------------------------------------------- */
  atomic {
    k = NOKEY; p = 0; res = 0; rk = 0; own = 0; wrote = 0; took = 0; open0 = 0;
    age[me] = AGECAP
  };
  if
  :: ALL_FINAL -> goto quit
  :: term[me] -> goto restart       /* shutting down: no more claims */
  :: atomic { !term[me] && jumpw && ANY_LEASED -> DBJUMP() }; goto scan
  :: atomic {
       !term[me] && ANY_CLAIMABLE ->
       if
       :: CLAIMABLE(0) -> k = 0
#if NK > 1
       :: CLAIMABLE(1) -> k = 1
#endif
       fi;
       WRITE_CHECK(k);
       took = (row[k].tok != 0 && row[k].aopen);
       open0 = row[k].aopen;
       row[k].st = S_PROC; row[k].tok = me + 1; row[k].lrem = L;
       row[k].due = 0; row[k].drem = 0;
       age[me] = 0; p = row[k].prov; own = 0; wrote = 0;
       if
       :: took -> printf("MSC: i%d CLAIMS key %d: a takeover (expired lease, open attempt)\n", me, k)
       :: else -> printf("MSC: i%d CLAIMS key %d (open attempt: %d)\n", me, k, open0)
       fi
     }
  fi;

  /* -- Deliverer::run, a resumed message (fresh == false) ------------- */
  STEP();
  if
#ifdef BUG_DEDUP_NO_WAIT
  :: took && !DEDUPES(p) ->
#else
  :: took ->
#endif
     /* A takeover: first wait until the previous owner's provider can no
        longer be acting on its request (on our own clock), then renew. */
     SLEEP(TW);
     STEP();
     RENEW();
     STEP()
  :: else -> skip
  fi;
  if
  :: open0 && !DEDUPES(p) ->
     /* The previous owner may have sent it: ask before sending again. */
     RECONCILE();
     STEP();
     if
     :: res == R_FOUND -> FINISH(S_SENT, MSGID(TWILIO, rk))
     :: res == R_UNKNOWN -> FINISH(S_UNKNOWN, 0)
     :: res == R_DEFER -> DEFER()
     :: res == R_NOTFOUND -> skip
     fi
  :: else -> skip                   /* de-duplicating: resend, same key */
  fi;
  /* decide(Event::Starting): no attempt left, give up. */
  if
  :: row[k].natt >= MAXATT ->
     FINISH(((row[k].maybe || row[k].aopen) -> S_UNKNOWN : S_FAILED), 0)
  :: else -> START_ATTEMPT()
  fi;
  STEP();
  goto check;                       /* it holds its send slot already */

call:
  /* -- Deliverer::run, one provider call ------------------------------ */
#ifndef BUG_SLOT_AFTER_CHECK
  SLOTWAIT();
  STEP();
#endif
check:
  (rq[me].ph == 0);                 /* (model) its previous request is over */
  if
  :: age[me] >= F -> RENEW(); STEP()    /* needs_renewal(lease.age()) */
  :: else -> skip
  fi;
#if defined(BUG_SLOT_AFTER_CHECK)
  if :: !LEASE_OK -> goto check :: else -> skip fi;
  SLOTWAIT();
  STEP();
  atomic { (rq[me].ph == 0); WRITE() }
#elif defined(PAUSE_IN_WINDOW)
  if :: !LEASE_OK -> goto check :: else -> skip fi;
  if
  :: pauses < MAXPAUSE && NFAULTS < MAXFAULTS ->
     printf("MSC: i%d: lease checked; the request not written yet\n", me);
     PAUSE()
  :: skip
  fi;
  atomic { (rq[me].ph == 0); WRITE() }
#elif CONNECT > 0
  /* The request goes out only once a connection is set up (pool checkout,
     DNS, TCP, TLS: up to CONNECT ticks, SENDONCE_PROVIDER_CONNECT_TIMEOUT);
     the shutdown token may cancel the call meanwhile. */
  if :: !LEASE_OK -> goto check :: else -> skip fi;
  printf("MSC: i%d: lease checked, connecting\n", me);
  if
  :: skip
  :: SLEEP(1)
#if CONNECT > 1
  :: SLEEP(2)
#endif
  fi;
  if :: stop[me] -> goto stopping :: else -> skip fi;
  atomic { (rq[me].ph == 0); WRITE() }
#else
  /* The local lease check and the write of the request: no await between
     them (one step). */
  atomic {
    if
    :: !LEASE_OK -> goto check
    :: else -> WRITE()
    fi
  }
#endif
  STEP();
  /* The answer: at once, when the message is on the phone (accepted), or
     at the timeout; or the shutdown token cuts the call off. */
  if
  :: (rq[me].ans == A_ACC && !rq[me].mk) ||
     (rq[me].ans != A_ACC && (!rq[me].late || !rq[me].ph)) -> res = rq[me].ans
  :: stop[me] -> goto stopping
  fi;
  STEP();
  /* decide::answered, route::route */
  if
  :: res == A_ACC -> FINISH(S_SENT, MSGID(p, k))
  :: res == A_REJ ->
     FINISH(((!DEDUPES(p) && row[k].maybe) -> S_UNKNOWN : S_FAILED), 0)
  :: res == A_RETRY -> RETRY_OR_MOVE(0)
  :: res == A_409 ->
#ifdef BUG_409_REJECTED
     FINISH(S_FAILED, 0)
#else
     RETRY(1, 1)                    /* retry later; maybe sent */
#endif
  :: res == A_AMB && DEDUPES(p) -> RETRY(1, 1)   /* resend with the same key */
  :: res == A_AMB && !DEDUPES(p) ->
#ifndef BUG_RECONCILE_EARLY
     /* The call has ended: the provider no longer acts on it. */
     if
     :: !rq[me].ph -> skip
     :: stop[me] -> goto stopping
     fi;
     STEP();
#endif
     RECONCILE();
     STEP();
     if
     :: res == R_FOUND -> FINISH(S_SENT, MSGID(TWILIO, rk))
     :: res == R_UNKNOWN -> FINISH(S_UNKNOWN, 0)
     :: res == R_DEFER -> DEFER()
     :: res == R_NOTFOUND -> RETRY_OR_MOVE(1)
     fi
  fi;

stopping:
  /* -- Deliverer::shutdown + release_leases: the grace period is over. -- */
  atomic {
    if
    :: MINE ->
       WRITE_CHECK(k);
#ifdef BUG_RELEASE_AT_ONCE
       /* every lease released at once, due now, the attempt still open */
       row[k].tok = 0; row[k].lrem = 0; row[k].due = 1; row[k].drem = 0;
       printf("MSC: i%d STOPS: releases key %d at once (attempt open)\n", me, k)
#else
       if
       :: !wrote && (own || !row[k].aopen) ->
          /* no request written: released at once, attempt never called */
          row[k].tok = 0; row[k].lrem = 0; row[k].due = 1; row[k].drem = 0;
          row[k].aopen = 0;
          printf("MSC: i%d STOPS: releases key %d at once (never called)\n", me, k)
#ifdef BUG_RELEASE_INHERITED
       :: !wrote && !own && row[k].aopen ->
          row[k].tok = 0; row[k].lrem = 0; row[k].due = 1; row[k].drem = 0;
          row[k].aopen = 0;
          printf("MSC: i%d STOPS: releases key %d at once, closing the open attempt\n", me, k)
#endif
       :: else ->
          /* a call in flight (or a previous owner's open attempt): the
             lease is shortened to db now + T, not released */
          row[k].lrem = T;
          printf("MSC: i%d STOPS: shortens its lease on key %d to T\n", me, k)
       fi
#endif
    :: else -> skip
    fi
  }
  goto restart;

crashed:
  goto restart;                     /* the task vanished; its lease stays */

lost:                               /* Report::LeaseLost: fenced out */
done:                               /* Report::Final, Report::Rescheduled */
  goto scan;

quit:
  live--
}

/* ------------------------------------------------------------------ */
/* The client: one cancel                                              */
/* ------------------------------------------------------------------ */

/* Store::cancel_message: one conditional UPDATE whose WHERE is
   domain::schedule::cancelable (scheduled; or processing with no lease, no
   open attempt and not maybe sent). A cancel that finds the row not
   cancelable changes nothing (409), so the model only lets the client
   choose, each time the row becomes cancelable, to cancel now or to let
   that chance go by. */
#ifdef BUG_CANCEL_MAYBE_SENT
#define CANCELABLE (row[0].st == S_SCHED || \
                    (row[0].st == S_PROC && row[0].tok == 0 && !row[0].aopen))
#else
#define CANCELABLE (row[0].st == S_SCHED || \
                    (row[0].st == S_PROC && row[0].tok == 0 && !row[0].aopen && !row[0].maybe))
#endif

proctype Client() {
  do
  :: atomic { ALL_FINAL -> live--; break }
  :: CANCELABLE ->
     if
     :: atomic {
          CANCELABLE ->
          SET_STATUS(0, S_CANCELED, 0); row[0].due = 0; row[0].drem = 0;
          printf("MSC: the client CANCELS key 0\n");
          live--;
          break
        }
     :: !CANCELABLE                 /* not now: let this chance go by */
     fi
  od
}

init {
  atomic {
#ifdef SIBLING
    live = NI;
#else
    live = NI + 1;
    run Client();
#endif
    if :: jumps < MAXJUMP && MAXFAULTS > 0 -> jumpw = 1 :: skip fi;
    run Provider();
    run Inst(0);
    run Inst(1);
#if NI > 2
    run Inst(2);
#endif
  }
#ifdef PROGRESS
  /* Every run ends, and ends with every accepted key final. */
  (live == 0);
  assert(ALL_FINAL)
#endif
}
