/*
 * The pglease lease protocol for one key and two replicas, as the code runs
 * it: internal/sqlstmt (Claim, Heartbeat, Release: the statements), locker.go
 * (Claim, register, supersede), jobs.go (a job's TTL and min hold),
 * heartbeat.go (the round, the trust deadline), lock.go (the release with
 * min hold and asynchronous commit, the round semaphore, checkTrust),
 * wait.go (the give-back of a waiting claim that failed), migrate.go
 * (purgeSQL). docs/MODEL.md explains it; model/check.sh runs it.
 *
 * Every event is one atomic step, chosen nondeterministically: a tick of the
 * server clock, a replica sending a statement or reading a reply, a client
 * giving up on a statement (which may still reach the server later), the
 * network losing one, the server running one (a claim in two steps around
 * its wait on the row lock), a crash, a purge, a WAL flush, the network
 * healing. A claim draws the fence of its INSERT arm (DEFAULT nextval) when
 * its VALUES are evaluated, and may then stall, for up to STALLMAX ticks,
 * before it reaches the row: other statements overtake it meanwhile.
 *
 * A claim is made on the Locker's TTL or on a job's shorter one (JTTL).
 * A client that stops waiting for a claim treats its outcome as unknown: it
 * hands out no lease, the replica's previous lease of the key is over from
 * then on, and the claim may still run later (one such late claim at a
 * time), while the replica goes on and may claim again. A waiting claim
 * that failed so gives back what it may have committed: it reads the row,
 * and releases it, fenced, if it carries the replica's holder, is live, and
 * has a fence greater than any the replica was handed. Heartbeats,
 * releases and give-backs can be given up on too, and still run later (one
 * such late statement at a time).
 *
 * Time is kept relative, so the model needs no horizon: every timestamp the
 * server stored is kept as (timestamp - now) in whole server ticks, and every
 * timestamp a replica keeps on its monotonic clock as (timestamp - its clock).
 * A tick lowers them all: server ones by 1, a replica's by how far its clock
 * moved during that tick. Values below the last one any comparison of the
 * protocol can tell apart are clamped, which keeps the state space finite.
 *
 * Buggy variants, one at a time (spin -DVARIANT_x); each must fail:
 *   VARIANT_A  fence DEFAULT 1 and fence + 1 per key, release by DELETE
 *   VARIANT_B  a re-entrant claim keeps the fence of its live row
 *   VARIANT_C  DO UPDATE sets acquired_at = clock_timestamp()
 *   VARIANT_D  the heartbeat lacks "expires_at > clock_timestamp()"
 *   VARIANT_E  the old give-back: one UPDATE matching holder and row shape
 *              (expires_at = acquired_at + TTL), not the fence
 *   VARIANT_F  the conflict arm sets expires_at = EXCLUDED.expires_at, not
 *              GREATEST(lease.expires_at, EXCLUDED.expires_at)
 * Where the protocol's assumptions end (spin -DLIMIT_x); each fails too:
 *   LIMIT_SLOW_CLOCK      a replica's clock may run slower than the server's
 *   LIMIT_RELEASE_WINDOW  a lease counts as held until its release returns
 *   LIMIT_OVERTAKE        statements may overtake a claim waiting on the row
 *                         lock: P3 fails (the purge); P1 fails only with the
 *                         conflict arm of VARIANT_F (spin -DLIMIT_OVERTAKE
 *                         -DVARIANT_F)
 *   LIMIT_HORIZON         the purge horizon is shorter than a claim's stall
 *                         (spin -DSTALLMAX=2 -DMINHOLD=0, with RET 1)
 * Bounds that shrink the state space (check.sh names the runs that use them):
 *   NOJOB      every claim is on the Locker's TTL
 *   NOLATE     a claim given up on never runs later (it was lost, or its
 *              reply was), and no claim gives back anything
 */

#ifndef TTL
#define TTL 3           /* lease duration, in ticks */
#endif
#ifndef JTTL
#define JTTL 1          /* a job's TTL (Locker.Job), in ticks, < TTL */
#endif
#ifndef MINHOLD
#define MINHOLD 2       /* WithMinHold, in ticks, <= TTL */
#endif
/* a job's min hold: the Locker's, or its TTL when that is shorter (Job
 * refuses a min hold longer than the job's TTL) */
#define JMINHOLD (MINHOLD < JTTL -> MINHOLD : JTTL)
#ifndef RET
#define RET 1           /* purge retention, in ticks */
#endif
#ifndef STALLMAX
#define STALLMAX 1      /* ticks a claim may stall after drawing its fence */
#endif
#ifndef MAXMID
#define MAXMID 4        /* mandates created before the network heals */
#endif
#ifndef W
#define W (TTL + 1)     /* P4: ticks the key may stay unused after healing */
#endif

#define N 2             /* replicas; replica i writes holder i + 1 */
#define LATE N          /* the claim slot of the late claim */

/* the terms of a lease (jb: claimed on a job's terms) */
#define TTLOF(jb) ((jb) -> JTTL : TTL)
#define MHOF(jb) ((jb) -> JMINHOLD : MINHOLD)

/* clamps: no comparison of the protocol tells apart values below these */
#define LOWE (-(RET + 1))           /* expires_at: purgeable from here */
#ifdef VARIANT_E
#define LOWA (-TTL)                 /* acquired_at: the old give-back compares
                                       acquired_at + TTL with a live expiry */
#else
#define LOWA (-MINHOLD)             /* acquired_at: min hold over from here */
#endif
#define LOWT1 (LOWE - TTL)          /* VALUES time of a waiting claim */
#define LOWS (-TTL)                 /* send time, local: trust over from here */

/* message slot states */
#define IDLE 0
#define NET  1          /* request on the network */
#define WAIT 2          /* claim at the server, waiting on the row lock */
#define REP  3          /* reply on the network */
#define STALLED 4       /* claim at the server, its row built (fence drawn),
                           not yet at the row: it can be overtaken */
#define LOST 5          /* claim gone in a crash: its client sees an error */

/* round statements */
#define HB  1
#define REL 2
#define OLDGB 3         /* VARIANT_E: the old give-back */

/* give-back states (IDLE: none) */
#define GREAD 1         /* the read of the row on its way */
#define GREL  2         /* the fenced release it decided on, on its way */
#define GOLD  3         /* VARIANT_E: the old give-back on its way */

/* a claim's reply */
#define NOROW 0         /* another holder's live lease: ErrHeld */
#define LIVE  1         /* a row came back, live = true */
#define DEAD  2         /* a row came back, live = false */

/* ---- the row as the server sees it ---- */
bool  rx;               /* the row exists */
byte  rh;               /* holder: 1..N */
byte  rf;               /* fence */
short ra;               /* acquired_at - now */
short re;               /* expires_at - now */
byte  rm;               /* ghost: the mandate that wrote it (claims in order) */
bool  rl;               /* ghost: this mandate's row has lapsed */

/* ---- the row as last flushed to the WAL: what a crash comes back to ---- */
bool dx; byte dh, df; short da, de; byte dm; bool dl;

byte seq;               /* the fence sequence: last value handed out. Only
                           the order of fences matters, so a value drawn and
                           never written is taken out again (discard) */
byte mids;              /* ghost: mandates created */
byte lastf;             /* ghost: greatest fence issued for the key */

/* ---- claims: slot i is replica i's claim, slot LATE a claim its client
 * gave up on, still on its way to the row ---- */
byte  cst[N + 1];       /* IDLE, NET, STALLED, WAIT, REP, LOST */
bool  cj[N + 1];        /* on a job's terms (JTTL) */
short ct1[N + 1];       /* time its VALUES were evaluated - now */
byte  cvf[N + 1];       /* the fence its VALUES drew (DEFAULT nextval) */
byte  cstall[N + 1];    /* ticks it has stalled */
byte  cown;             /* the replica of the late claim */
short csent[N];         /* send time - local clock */
byte  crr[N];           /* reply: NOROW, LIVE, DEAD */
byte  crf[N], crm[N];   /* reply: fence; ghost mandate */
byte  wq[N + 1]; byte wn; /* the row-lock queue of waiting claims (slots), FIFO */

/* ---- heartbeat or release: the round semaphore lets one run per replica ---- */
byte  rst[N];           /* IDLE, NET, REP */
byte  rk[N];            /* HB or REL */
bool  rcur[N];          /* it is for the replica's newest lease */
byte  rfe[N], rmi[N];   /* fence; ghost mandate */
bool  rj[N];            /* the lease's terms */
short rsent[N];         /* send time - local clock */
bool  rok[N];           /* reply: the row came back */
/* one round statement or give-back a client gave up on, still on its way */
byte ost;               /* IDLE or NET */
byte oi, okd, ofe, omi; /* replica, kind, fence, ghost mandate */
bool oj;                /* terms */

/* ---- the give-back of a claim given up on, in the key's turn ---- */
byte  gst[N];           /* IDLE, GREAD, GREL, GOLD */
bool  gj[N];            /* the failed claim's terms: its min hold */
byte  gfe[N], gmi[N];   /* GREL: the fence read; ghost mandate */

/* ---- each replica's view of its newest lease ---- */
bool  al[N];            /* held: Err() == nil */
byte  lf[N], lm[N];     /* fence; ghost mandate */
bool  lj[N];            /* its terms */
short tr[N];            /* trust deadline - local clock */
bool  lrel[N];          /* its release is in flight */
bool  unrel[N];         /* Unlock not called yet (held or lost) */
byte  pf[N], pm[N];     /* a lease superseded by a re-entrant claim and never
                           unlocked: fence, ghost mandate (0: none) */
bool  pj[N];            /* its terms */
byte  hf[N];            /* the greatest fence the replica was handed */

/* ---- liveness ---- */
bool healed;            /* the network has healed; replica 0 keeps running */
bool tried0;            /* replica 0 finished a claim during this tick */
bool usedTick;          /* a lease was handed out or extended during this tick */
bool claimedHealed;     /* a lease was handed out since the network healed */
byte idle;              /* ticks since healing with the key unused */

byte j;                 /* loop index */
bool fresh;             /* ghost, within a claim's step: it wrote a new fence */
byte got;               /* within a claim's step: its result (NOROW, LIVE, DEAD) */

/* a mandate believes itself valid: held, within its trust deadline, and
 * (unless LIMIT_RELEASE_WINDOW) not being released */
#ifdef LIMIT_RELEASE_WINDOW
#define B(i) (al[i] && tr[i] > 0)
#else
#define B(i) (al[i] && tr[i] > 0 && !lrel[i])
#endif

/* P1: never two mandates that both believe themselves valid. A belief only
 * starts when a claim's reply registers a lease or a heartbeat's reply moves
 * the trust deadline; ticks, releases and losses only end beliefs. So P1 is
 * asserted after those two steps, which covers every reachable state. */
#define P1 assert(!(B(0) && B(1)))

#define FLUSH d_step { dx = rx; dh = rh; df = rf; da = ra; de = re; dm = rm; dl = rl }
#define DROPROW d_step { rx = 0; rh = 0; rf = 0; ra = 0; re = 0; rm = 0; rl = 0 }

/* other statements on the row queue behind a waiting claim */
#ifdef LIMIT_OVERTAKE
#define NOWAIT true
#define OWNNOWAIT(i) true
#else
#define NOWAIT (wn == 0)
#define OWNNOWAIT(i) (cst[i] != STALLED)
#endif

/* time moves on only while no claim has stalled for STALLMAX ticks */
#define STALLOK (!(cst[0] == STALLED && cstall[0] >= STALLMAX) && !(cst[1] == STALLED && cstall[1] >= STALLMAX) && !(cst[LATE] == STALLED && cstall[LATE] >= STALLMAX))

/* acquired_at set by DO UPDATE, relative to now: EXCLUDED.acquired_at is t1 */
#ifdef VARIANT_C
#define ACQ(k) 0
#else
#define ACQ(k) ct1[k]
#endif

/* expires_at set by DO UPDATE, relative to now: EXCLUDED.expires_at is
 * t1 + the claim's TTL; the row's own is kept when it is later */
#ifdef VARIANT_F
#define EXPUPD(k) (ct1[k] + TTLOF(cj[k]))
#else
#define EXPUPD(k) max(re, ct1[k] + TTLOF(cj[k]))
#endif

/* sqlstmt.Heartbeat's "expires_at > clock_timestamp()" */
#ifdef VARIANT_D
#define HBLIVE true
#else
#define HBLIVE (re > 0)
#endif

#define max(a, b) ((a) > (b) -> (a) : (b))

/* P3: fences handed out for the key strictly increase, across purges too */
inline issue(f) {
	assert(f > lastf);
	lastf = f
}

/* renumber: fence v, drawn and never written, is taken out of the order */
#define DOWN(x) if :: x > v -> x-- :: else -> skip fi
inline discard(v) {
	printf("MSC: fence %d, drawn and never written, is taken out of the order (greater ones move down by 1)\n", v);
	d_step {
		DOWN(rf); DOWN(df); DOWN(lastf); DOWN(ofe);
		DOWN(lf[0]); DOWN(lf[1]); DOWN(pf[0]); DOWN(pf[1]);
		DOWN(rfe[0]); DOWN(rfe[1]); DOWN(crf[0]); DOWN(crf[1]);
		DOWN(cvf[0]); DOWN(cvf[1]); DOWN(cvf[LATE]);
		DOWN(hf[0]); DOWN(hf[1]); DOWN(gfe[0]); DOWN(gfe[1]);
		seq--
	}
}

/* claim slot k no longer needs the fence its VALUES drew */
inline dropDraw(k) {
	if
	:: cvf[k] != 0 -> discard(cvf[k]); cvf[k] = 0
	:: else -> skip
	fi
}

/* The claim in slot k, of replica h, leaves the row-lock queue and runs now
 * (t2). Its VALUES were evaluated at t1 = now + ct1[k], before the wait. */
inline claimRuns(k, h) {
	got = NOROW;
	if
	:: !rx ->
		/* INSERT: the fence its VALUES drew, acquired_at = t1 */
#ifdef VARIANT_A
		rf = 1;
#else
		rf = cvf[k]; cvf[k] = 0;
#endif
		fresh = 1;
		rx = 1; rh = h + 1;
		ra = max(ct1[k], LOWA); re = max(ct1[k] + TTLOF(cj[k]), LOWE);
		mids++; rm = mids; rl = (re <= 0);
		got = (re > 0 -> LIVE : DEAD);      /* RETURNING ... live */
		FLUSH                               /* synchronous commit */
	:: rx && (rh == h + 1 || re <= 0) ->
		/* ON CONFLICT DO UPDATE ... WHERE holder = mine OR expired */
		/* P5: CHECK (expires_at > acquired_at) holds: no SQLSTATE 23514 */
		assert(EXPUPD(k) > ACQ(k));
		ra = max(ACQ(k), LOWA);
#ifdef VARIANT_B
		if
		:: rh == h + 1 && re > 0 -> skip    /* re-entrant: the fence is kept */
		:: else -> seq++; rf = seq; fresh = 1
		fi;
#else
#ifdef VARIANT_A
		rf = rf + 1; fresh = 1;
#else
		seq++; rf = seq; fresh = 1;
#endif
#endif
		re = max(EXPUPD(k), LOWE);
		rh = h + 1;
		mids++; rm = mids; rl = (re <= 0);
		got = (re > 0 -> LIVE : DEAD);
		FLUSH
	:: else -> skip                         /* another holder's live lease: no row */
	fi;
	if
	:: k == LATE -> printf("MSC: late claim of %d (ttl %d) runs, waited %d: row holder %d fence %d expires %d, live %d\n", h, TTLOF(cj[k]), -ct1[k], rh, rf, re, got == LIVE)
	:: else -> printf("MSC: claim of %d (ttl %d) runs, waited %d: row holder %d fence %d expires %d, live %d\n", h, TTLOF(cj[k]), -ct1[k], rh, rf, re, got == LIVE)
	fi;
	dropDraw(k);                            /* the DO UPDATE arm, or no row */
	if
	:: got == LIVE && fresh -> issue(rf)
	:: else -> skip                         /* no row, or live = false: nothing */
	fi;
	if
	:: k != LATE && got == LIVE -> crr[k] = LIVE; crf[k] = rf; crm[k] = rm
	:: k != LATE && got != LIVE -> crr[k] = got
	:: else -> skip                         /* nobody reads its reply */
	fi;
	got = NOROW; fresh = 0;
	ct1[k] = 0
}

/* a heartbeat or release (kind k, fence f, ghost mandate m, terms jb) of
 * replica i runs */
inline roundRuns(i, k, f, m, jb, ok) {
	ok = 0;
	if
	:: k == HB && rx && rh == i + 1 && rf == f && HBLIVE ->
		assert(rm == m);        /* P2: it changes only its own mandate's row */
		assert(!rl);            /* P6: a lapsed lease never comes back */
		re = max(re, TTLOF(jb)); rl = 0;  /* never moves an expiry back */
		printf("MSC: heartbeat of %d fence %d extends the row to %d\n", i, f, re);
		ok = 1;
		FLUSH                   /* synchronous commit */
	:: k == REL && rx && rh == i + 1 && rf == f && re > 0 ->
		assert(rm == m);        /* P2 */
#ifdef VARIANT_A
		DROPROW;                /* DELETE */
		printf("MSC: release of %d fence %d deletes the row (not flushed)\n", i, f);
#else
		/* GREATEST(clock_timestamp(), acquired_at + min hold) */
		if
		:: ra + MHOF(jb) > 0 -> re = ra + MHOF(jb)
		:: else -> re = 0; rl = 1
		fi;
		printf("MSC: release of %d fence %d: row expires %d (not flushed)\n", i, f, re);
#endif
		ok = 1                  /* synchronous_commit off: not flushed */
#ifdef VARIANT_E
	:: k == OLDGB && rx && rh == i + 1 && re > 0 && re == ra + TTL ->
		/* any live row of its holder shaped like a fresh claim of the
		 * Locker's TTL, whatever its fence; the Locker's min hold */
		if
		:: ra + MINHOLD > 0 -> re = ra + MINHOLD
		:: else -> re = 0; rl = 1
		fi;
		printf("MSC: old give-back of %d expires fence %d: row expires %d\n", i, rf, re);
		ok = 1;
		FLUSH
#endif
	:: else -> printf("MSC: heartbeat or release of %d fence %d matches no row\n", i, f)
	fi
}

/* the lease of replica i has ended; what nothing reads any more is cleared */
inline ends(i) {
	al[i] = 0; lrel[i] = 0; tr[i] = 0;
	if :: !unrel[i] -> lf[i] = 0; lm[i] = 0; lj[i] = 0 :: else -> skip fi
}

inline clearRound(i) {
	rst[i] = IDLE; rk[i] = 0; rcur[i] = 0; rfe[i] = 0; rmi[i] = 0; rj[i] = 0; rsent[i] = 0; rok[i] = 0
}

inline clearLate() {
	ost = IDLE; oi = 0; okd = 0; ofe = 0; omi = 0; oj = 0
}

inline clearGiveBack(i) {
	gst[i] = IDLE; gj[i] = 0; gfe[i] = 0; gmi[i] = 0
}

inline clearClaim(i) {
	dropDraw(i);
	cst[i] = IDLE; cj[i] = 0; csent[i] = 0; ct1[i] = 0; crr[i] = NOROW; crf[i] = 0; crm[i] = 0; cstall[i] = 0
}

inline clearLateClaim() {
	dropDraw(LATE);
	cst[LATE] = IDLE; cj[LATE] = 0; ct1[LATE] = 0; cstall[LATE] = 0; cown = 0
}

/* the client of replica i stops waiting for its heartbeat or release: the
 * request may still run later, or it was lost, or its reply was */
inline roundGivesUp(i) {
	if
	:: rst[i] == NET && ost == IDLE ->
		ost = NET; oi = i; okd = rk[i]; ofe = rfe[i]; omi = rmi[i]; oj = rj[i]
	:: else -> skip
	fi;
	if
	:: rk[i] == REL && rcur[i] && lrel[i] -> ends(i)     /* ended with the error */
	:: else -> skip
	fi;
	clearRound(i)
}

/* the client of replica i may stop waiting for its claim: any time before
 * the network heals while its request or reply is on the network, or while
 * it is at the server if the late slot is free; after a crash, always */
#ifdef NOLATE
#define CANGIVEUP(i) (!healed && (cst[i] == NET || cst[i] == REP) || cst[i] == LOST)
#else
#define CANGIVEUP(i) (!healed && (cst[i] == NET || cst[i] == REP || cst[i] != IDLE && cst[LATE] == IDLE) || cst[i] == LOST)
#endif

/* the claim of replica i goes on without its client, in the late slot */
inline goesLate(i) {
	cst[LATE] = cst[i]; cj[LATE] = cj[i]; ct1[LATE] = ct1[i]; cvf[LATE] = cvf[i];
	cstall[LATE] = cstall[i]; cown = i; cvf[i] = 0;
	for (j : 0 .. N) {
		if :: j < wn && wq[j] == i -> wq[j] = LATE :: else -> skip fi
	};
	j = 0;
	printf("MSC: claim of %d goes on, late\n", i)
}

/* the client of replica i stops waiting for its claim (its deadline, a
 * broken connection): the outcome is unknown. No lease, and the previous
 * lease of the key is over, since the claim may have superseded it. The
 * statement was lost, or its reply was, or it goes on late. A waiting
 * claim then gives back what it may have committed, in the key's turn. */
inline claimGivesUp(i) {
	printf("MSC: %d stops waiting for its claim\n", i);
	if :: al[i] -> printf("MSC: %d no longer trusts fence %d\n", i, lf[i]); ends(i) :: else -> skip fi;
	if
	:: cst[i] == NET || cst[i] == REP || cst[i] == LOST -> skip   /* lost, or its reply */
#ifndef NOLATE
	:: (cst[i] == NET || cst[i] == STALLED || cst[i] == WAIT) && cst[LATE] == IDLE -> goesLate(i)
#endif
	fi;
#ifndef NOLATE
	if
#ifdef VARIANT_E
	:: gst[i] = GOLD; gj[i] = cj[i]; printf("MSC: %d sends the old give-back\n", i)
#else
	:: gst[i] = GREAD; gj[i] = cj[i]; printf("MSC: %d reads the row to give it back\n", i)
#endif
	:: skip
	fi;
#endif
	clearClaim(i)
}

/* a replica's clock moves by d during a server tick */
inline localTick(i, d) {
	tr[i] = max(tr[i] - d, 0);
	if :: cst[i] != IDLE && cst[i] != LOST -> csent[i] = max(csent[i] - d, LOWS) :: else -> skip fi;
	if :: rst[i] != IDLE && rk[i] == HB -> rsent[i] = max(rsent[i] - d, LOWS) :: else -> skip fi
}

inline tick() {
	if
	:: healed && !claimedHealed ->
		/* P4: after healing, the key does not stay unused for W ticks */
		if
		:: B(0) || B(1) || usedTick -> idle = 0
		:: else -> idle++
		fi;
		assert(idle < W)
	:: else -> skip
	fi;
	tried0 = 0; usedTick = 0;
	printf("MSC: tick\n");
	/* the server clock moves by one */
	if
	:: rx -> re = max(re - 1, LOWE); ra = max(ra - 1, LOWA); rl = rl || re <= 0
	:: else -> skip
	fi;
	if
	:: dx -> de = max(de - 1, LOWE); da = max(da - 1, LOWA); dl = dl || de <= 0
	:: else -> skip
	fi;
	for (j : 0 .. N) {
		if :: cst[j] == WAIT -> ct1[j] = max(ct1[j] - 1, LOWT1) :: else -> skip fi;
		if :: cst[j] == STALLED -> ct1[j] = max(ct1[j] - 1, LOWT1); cstall[j]++ :: else -> skip fi
	};
	for (j : 0 .. N - 1) {
		/* each replica's clock moves by 1, or by 2 when it runs fast */
		if
		:: localTick(j, 1)
		:: localTick(j, 2)
#ifdef LIMIT_SLOW_CLOCK
		:: skip             /* it runs slow: it did not move */
#endif
		fi
	};
	j = 0
}

/* a claim arrives: its VALUES are evaluated now (t1), drawing the INSERT
 * arm's fence; it may stall before it reaches the row */
inline arrives(k) {
	ct1[k] = 0; cst[k] = STALLED; cstall[k] = 0;
#ifndef VARIANT_A
	seq++; cvf[k] = seq;
#endif
	if
	:: k == LATE -> printf("MSC: late claim of %d arrives (VALUES evaluated, fence %d drawn)\n", cown, cvf[k])
	:: else -> printf("MSC: claim of %d arrives (VALUES evaluated, fence %d drawn)\n", k, cvf[k])
	fi
}

/* it reaches the row, and queues on the row lock */
inline reaches(k) {
	wq[wn] = k; wn++; cst[k] = WAIT; cstall[k] = 0;
	if
	:: k == LATE -> printf("MSC: late claim of %d reaches the row\n", cown)
	:: else -> printf("MSC: claim of %d reaches the row\n", k)
	fi
}

/* ---- a replica: its Locker and the code that calls it ---- */
proctype replica(byte i)
{
	do
	:: if
	   /* Claim: one statement, on the Locker's terms or a job's, in the
	    * key's turn (no give-back of the key on its way) */
	   :: atomic {
		cst[i] == IDLE && gst[i] == IDLE &&
		(healed && i == 0 && !tried0 && !claimedHealed ||
		 !healed && mids + (cst[0] != IDLE) + (cst[1] != IDLE) + (cst[LATE] != IDLE) < MAXMID) ->
		cst[i] = NET; csent[i] = 0;
#ifndef NOJOB
		if :: cj[i] = 0 :: cj[i] = 1 fi;
#endif
		printf("MSC: %d sends a claim, ttl %d\n", i, TTLOF(cj[i]))
	   }
	   /* its reply */
	   :: atomic {
		cst[i] == REP ->
		if
		:: crr[i] == LIVE ->
			/* register: the newest lease; the previous one is lost */
			if
			:: unrel[i] -> pf[i] = lf[i]; pm[i] = lm[i]; pj[i] = lj[i]
			:: else -> skip
			fi;
			rcur[i] = 0;
			al[i] = 1; lf[i] = crf[i]; lm[i] = crm[i]; lj[i] = cj[i];
#ifndef NOLATE
			hf[i] = crf[i];
#endif
			tr[i] = max(csent[i] + TTLOF(cj[i]), 0);
			lrel[i] = 0; unrel[i] = 1;
			usedTick = healed; claimedHealed = healed;
			printf("MSC: %d holds fence %d, ttl %d, trust %d\n", i, lf[i], TTLOF(lj[i]), tr[i]);
			P1
		:: crr[i] == DEAD ->
			/* the row came back expired: nothing, and the previous
			 * lease is superseded by its new fence */
			if :: al[i] -> ends(i); printf("MSC: %d superseded by an expired claim\n", i) :: else -> skip fi
		:: else -> skip     /* ErrHeld */
		fi;
		tried0 = tried0 || healed && i == 0;
		clearClaim(i)
	   }
	   /* the client stops waiting for its claim (at the server too, if the
	    * late slot is free) */
	   :: atomic {
		CANGIVEUP(i) -> claimGivesUp(i)
	   }
	   /* a heartbeat round: a lease held and within its trust deadline */
	   :: atomic {
		rst[i] == IDLE && al[i] && !lrel[i] && tr[i] > 0 ->
		rst[i] = NET; rk[i] = HB; rcur[i] = 1; rfe[i] = lf[i]; rmi[i] = lm[i]; rj[i] = lj[i]; rsent[i] = 0;
		printf("MSC: %d sends a heartbeat for fence %d\n", i, lf[i])
	   }
	   /* its reply */
	   :: atomic {
		rst[i] == REP && rk[i] == HB ->
		if
		:: rcur[i] && al[i] && rok[i] ->
			tr[i] = max(rsent[i] + TTLOF(lj[i]), 0);
			printf("MSC: %d extended, trust %d\n", i, tr[i]);
			usedTick = usedTick || healed && tr[i] > 0;
			P1
		:: rcur[i] && al[i] && !rok[i] -> ends(i); printf("MSC: %d told lost\n", i)
		:: else -> skip     /* the lease has ended meanwhile */
		fi;
		clearRound(i)
	   }
	   /* checkTrust: past its trust deadline a lease is lost */
	   :: atomic { al[i] && tr[i] <= 0 -> ends(i); printf("MSC: %d past its trust deadline\n", i) }
	   /* Unlock of the newest lease, held or lost, once the round is free */
	   :: atomic {
		rst[i] == IDLE && unrel[i] ->
		printf("MSC: %d unlocks fence %d\n", i, lf[i]);
		unrel[i] = 0; lrel[i] = al[i];
		rst[i] = NET; rk[i] = REL; rcur[i] = 1; rfe[i] = lf[i]; rmi[i] = lm[i]; rj[i] = lj[i];
		if :: !al[i] -> lf[i] = 0; lm[i] = 0; lj[i] = 0; rcur[i] = 0 :: else -> skip fi
	   }
	   /* a late Unlock of a lease superseded by a re-entrant claim */
	   :: atomic {
		rst[i] == IDLE && pf[i] != 0 ->
		printf("MSC: %d unlocks superseded fence %d\n", i, pf[i]);
		rst[i] = NET; rk[i] = REL; rcur[i] = 0; rfe[i] = pf[i]; rmi[i] = pm[i]; rj[i] = pj[i];
		pf[i] = 0; pm[i] = 0; pj[i] = 0
	   }
	   /* the release's reply: the lease has ended */
	   :: atomic {
		rst[i] == REP && rk[i] == REL ->
		if :: rcur[i] && lrel[i] -> ends(i); printf("MSC: %d released\n", i) :: else -> skip fi;
		clearRound(i)
	   }
	   /* the give-back's client stops waiting (the Locker's timeout): its
	    * release may still run later, or it was lost */
	   :: atomic {
		!healed && gst[i] != IDLE ->
		printf("MSC: %d stops waiting for its give-back\n", i);
		if
		:: gst[i] == GREL && ost == IDLE ->
			ost = NET; oi = i; okd = REL; ofe = gfe[i]; omi = gmi[i]; oj = gj[i]
		:: gst[i] == GOLD && ost == IDLE ->
			ost = NET; oi = i; okd = OLDGB; oj = gj[i]
		:: else -> skip     /* lost; a late read changes nothing */
		fi;
		clearGiveBack(i)
	   }
	   fi
	od
}

/* ---- the network between replica i and the server, and the server
 * running replica i's statements ---- */
proctype link(byte i)
{
	bool okv;
	do
	:: if
	   /* the client stops waiting for its heartbeat or release (the
	    * deadline of the round, a broken connection) */
	   :: atomic {
		!healed && rst[i] != IDLE ->
		if
		:: rk[i] == HB -> printf("MSC: %d stops waiting for its heartbeat\n", i)
		:: else -> printf("MSC: %d stops waiting for its release\n", i)
		fi;
		roundGivesUp(i)
	   }
	   :: atomic { cst[i] == NET -> arrives(i) }
	   :: atomic { cst[i] == STALLED -> reaches(i) }
	   /* a heartbeat or release runs (not past its own replica's stalled
	    * claim: that is LIMIT_OVERTAKE) */
	   :: atomic {
		NOWAIT && OWNNOWAIT(i) && rst[i] == NET ->
		roundRuns(i, rk[i], rfe[i], rmi[i], rj[i], okv);
		rok[i] = okv && rk[i] == HB; okv = 0; rst[i] = REP
	   }
	   /* the give-back's read: a plain SELECT of the row, which waits on
	    * no lock. Only a live row of this holder with a fence it was never
	    * handed is given back, by the ordinary fenced release */
	   :: atomic {
		gst[i] == GREAD ->
		if
		:: rx && rh == i + 1 && re > 0 && rf > hf[i] ->
			gst[i] = GREL; gfe[i] = rf; gmi[i] = rm;
			printf("MSC: give-back of %d reads fence %d, never handed: releases it\n", i, rf)
		:: else ->
			printf("MSC: give-back of %d reads nothing to give back\n", i);
			clearGiveBack(i)
		fi
	   }
	   :: atomic {
		NOWAIT && OWNNOWAIT(i) && gst[i] == GREL ->
		roundRuns(i, REL, gfe[i], gmi[i], gj[i], okv); okv = 0;
		clearGiveBack(i)
	   }
#ifdef VARIANT_E
	   :: atomic {
		NOWAIT && OWNNOWAIT(i) && gst[i] == GOLD ->
		roundRuns(i, OLDGB, 0, 0, gj[i], okv); okv = 0;
		clearGiveBack(i)
	   }
#endif
	   fi
	od
}

/* ---- time, the row lock, late statements, Migrate, the WAL, crashes,
 * healing ---- */
proctype env()
{
	byte i;
	bool okv;
	do
	:: if
	   :: atomic {
		STALLOK &&
		(!healed ||
		(cst[0] == IDLE && cst[1] != NET && cst[1] != WAIT && cst[1] != STALLED &&
		 cst[LATE] == IDLE && gst[0] == IDLE && gst[1] == IDLE &&
		 rst[0] == IDLE && rst[1] != NET && ost == IDLE &&
		 (tried0 || B(0) || claimedHealed))) ->
		tick()
	   }
	   /* the claim at the head of the row-lock queue runs */
	   :: atomic {
		wn > 0 ->
		i = wq[0]; wq[0] = wq[1]; wq[1] = wq[2]; wq[2] = 0; wn--;
		if
		:: i == LATE -> claimRuns(LATE, cown); clearLateClaim()
		:: else -> claimRuns(i, i); cst[i] = REP
		fi;
		i = 0
	   }
	   /* the late claim arrives, reaches the row, or is lost on its way */
	   :: atomic { cst[LATE] == NET -> arrives(LATE) }
	   :: atomic { cst[LATE] == STALLED -> reaches(LATE) }
	   :: atomic { !healed && cst[LATE] == NET -> printf("MSC: late claim lost\n"); clearLateClaim() }
	   /* the statement a client gave up on runs, or is lost */
	   :: atomic {
		NOWAIT && OWNNOWAIT(oi) && ost == NET ->
		printf("MSC: a statement nobody waits for runs\n");
		roundRuns(oi, okd, ofe, omi, oj, okv);
		okv = 0; clearLate()
	   }
	   :: atomic { !healed && ost == NET -> clearLate() }
	   /* Migrate's purge: a row expired longer than the retention ago */
	   :: atomic {
		NOWAIT && rx && re + RET < 0 -> DROPROW; FLUSH; printf("MSC: purge\n")
	   }
	   /* the WAL writer flushes an asynchronous commit */
	   :: atomic {
		dx != rx || dh != rh || df != rf || da != ra || de != re || dm != rm || dl != rl ->
		FLUSH; printf("MSC: WAL flushed\n")
	   }
	   /* a crash and restart: the row comes back as last flushed, every
	    * connection breaks (every request and reply is lost), and the
	    * sequence never goes back */
	   :: atomic {
		!healed ->
		printf("MSC: crash\n");
		rx = dx; rh = dh; rf = df; ra = da; re = de; rm = dm; rl = dl;
		wn = 0; wq[0] = 0; wq[1] = 0; wq[2] = 0;
		for (j : 0 .. N - 1) {
			if
			:: cst[j] != IDLE && cst[j] != LOST ->
				dropDraw(j); cst[j] = LOST; csent[j] = 0; ct1[j] = 0; cstall[j] = 0;
				crr[j] = NOROW; crf[j] = 0; crm[j] = 0
			:: else -> skip
			fi;
			if :: rst[j] != IDLE -> roundGivesUp(j) :: else -> skip fi;
			clearGiveBack(j)
		};
		j = 0;
		if :: cst[LATE] != IDLE -> clearLateClaim() :: else -> skip fi;
		clearLate()
	   }
	   /* the network heals for good, and replica 0 keeps running: its
	    * statements and everyone's requests are answered within the tick */
	   :: atomic {
		!healed -> healed = 1; tried0 = 0; usedTick = 0; idle = 0; printf("MSC: healed\n")
	   }
	   fi
	od
}

init {
	atomic {
		run env();
		run replica(0); run replica(1);
		run link(0); run link(1)
	}
}
