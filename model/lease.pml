/*
 * The pglease lease protocol for one key and two replicas, as the code runs
 * it: internal/sqlstmt (Claim, Heartbeat, Release: the statements), locker.go
 * (Claim, register), heartbeat.go (the round, the trust deadline), lock.go
 * (the release with min hold and asynchronous commit, the round semaphore,
 * checkTrust), migrate.go (purgeSQL). docs/MODEL.md explains it; model/check.sh runs it.
 *
 * Every event is one atomic step, chosen nondeterministically: a tick of the
 * server clock, a replica sending a statement or reading a reply, the network
 * losing one, the server running one (a claim in two steps around its wait
 * on the row lock), a crash, a purge, a WAL flush, the network healing.
 * A claim draws the fence of its INSERT arm (DEFAULT nextval) when its
 * VALUES are evaluated, and may then stall, for up to STALLMAX ticks, before
 * it reaches the row: other statements overtake it meanwhile.
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
 * Where the protocol's assumptions end (spin -DLIMIT_x); each fails too:
 *   LIMIT_SLOW_CLOCK      a replica's clock may run slower than the server's
 *   LIMIT_RELEASE_WINDOW  a lease counts as held until its release returns
 *   LIMIT_OVERTAKE        statements may overtake a claim waiting on the row lock
 *   LIMIT_HORIZON         the purge horizon is shorter than a claim's stall
 *                         (spin -DSTALLMAX=2 -DMINHOLD=0, with RET 1)
 */

#ifndef TTL
#define TTL 3           /* lease duration, in ticks */
#endif
#ifndef MINHOLD
#define MINHOLD 2       /* WithMinHold, in ticks, <= TTL */
#endif
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

/* clamps: no comparison of the protocol tells apart values below these */
#define LOWE (-(RET + 1))           /* expires_at: purgeable from here */
#define LOWA (-MINHOLD)             /* acquired_at: min hold over from here */
#define LOWT1 (LOWE - TTL)          /* VALUES time of a waiting claim */
#define LOWS (-TTL)                 /* send time, local: trust over from here */

/* message slot states */
#define IDLE 0
#define NET  1          /* request on the network */
#define WAIT 2          /* claim at the server, waiting on the row lock */
#define REP  3          /* reply on the network */
#define STALLED 4       /* claim at the server, its row built (fence drawn),
                           not yet at the row: it can be overtaken */

#define HB  1
#define REL 2

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

/* ---- claims: one in flight per replica ---- */
byte  cst[N];           /* IDLE, NET, WAIT, REP */
short csent[N];         /* send time - local clock */
short ct1[N];           /* time its VALUES were evaluated - now */
byte  cvf[N];           /* the fence its VALUES drew (DEFAULT nextval) */
byte  cstall[N];        /* ticks it has stalled */
bool  crlive[N];        /* reply: a row came back and live = true */
byte  crf[N], crm[N];   /* reply: fence; ghost mandate */
byte  wq[N]; byte wn;   /* the row-lock queue of waiting claims, FIFO */

/* ---- heartbeat or release: the round semaphore lets one run per replica ---- */
byte  rst[N];           /* IDLE, NET, REP */
byte  rk[N];            /* HB or REL */
bool  rcur[N];          /* it is for the replica's newest lease */
byte  rfe[N], rmi[N];   /* fence; ghost mandate */
short rsent[N];         /* send time - local clock */
bool  rok[N];           /* reply: the row came back */
/* one round statement a client gave up on, still on its way */
byte ost;               /* IDLE or NET */
byte oi, okd, ofe, omi; /* replica, kind, fence, ghost mandate */

/* ---- each replica's view of its newest lease ---- */
bool  al[N];            /* held: Err() == nil */
byte  lf[N], lm[N];     /* fence; ghost mandate */
short tr[N];            /* trust deadline - local clock */
bool  lrel[N];          /* its release is in flight */
bool  unrel[N];         /* Unlock not called yet (held or lost) */
byte  pf[N], pm[N];     /* a lease superseded by a re-entrant claim and never
                           unlocked: fence, ghost mandate (0: none) */

/* ---- liveness ---- */
bool healed;            /* the network has healed; replica 0 keeps running */
bool tried0;            /* replica 0 finished a claim during this tick */
bool claimedTick;       /* a lease was handed out during this tick */
bool claimedHealed;     /* a lease was handed out since the network healed */
byte idle;              /* ticks since healing with the key unused */

byte j;                 /* loop index */
bool fresh;             /* ghost, within a claim's step: it wrote a new fence */

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
#define STALLOK (!(cst[0] == STALLED && cstall[0] >= STALLMAX) && !(cst[1] == STALLED && cstall[1] >= STALLMAX))

/* acquired_at set by DO UPDATE, relative to now: EXCLUDED.acquired_at is t1 */
#ifdef VARIANT_C
#define ACQ(i) 0
#else
#define ACQ(i) ct1[i]
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
	d_step {
		DOWN(rf); DOWN(df); DOWN(lastf); DOWN(ofe);
		DOWN(lf[0]); DOWN(lf[1]); DOWN(pf[0]); DOWN(pf[1]);
		DOWN(rfe[0]); DOWN(rfe[1]); DOWN(crf[0]); DOWN(crf[1]);
		DOWN(cvf[0]); DOWN(cvf[1]);
		seq--
	}
}

/* claim i no longer needs the fence its VALUES drew */
inline dropDraw(i) {
	if
	:: cvf[i] != 0 -> discard(cvf[i]); cvf[i] = 0
	:: else -> skip
	fi
}

/* The claim of replica i leaves the row-lock queue and runs now (t2). Its
 * VALUES were evaluated at t1 = now + ct1[i], before the wait. */
inline claimRuns(i) {
	crlive[i] = 0;
	if
	:: !rx ->
		/* INSERT: the fence its VALUES drew, acquired_at = t1 */
#ifdef VARIANT_A
		rf = 1;
#else
		rf = cvf[i]; cvf[i] = 0;
#endif
		fresh = 1;
		rx = 1; rh = i + 1;
		ra = max(ct1[i], LOWA); re = max(ct1[i] + TTL, LOWE);
		mids++; rm = mids; rl = (re <= 0);
		crlive[i] = (re > 0);           /* RETURNING ... live */
		FLUSH                           /* synchronous commit */
	:: rx && (rh == i + 1 || re <= 0) ->
		/* ON CONFLICT DO UPDATE ... WHERE holder = mine OR expired */
		/* P5: CHECK (expires_at > acquired_at) holds: no SQLSTATE 23514 */
		assert(ct1[i] + TTL > ACQ(i));
		ra = max(ACQ(i), LOWA);
#ifdef VARIANT_B
		if
		:: rh == i + 1 && re > 0 -> skip    /* re-entrant: the fence is kept */
		:: else -> seq++; rf = seq; fresh = 1
		fi;
#else
#ifdef VARIANT_A
		rf = rf + 1; fresh = 1;
#else
		seq++; rf = seq; fresh = 1;
#endif
#endif
		rh = i + 1;
		re = max(ct1[i] + TTL, LOWE);   /* EXCLUDED.expires_at */
		mids++; rm = mids; rl = (re <= 0);
		crlive[i] = (re > 0);
		FLUSH
	:: else -> skip                     /* another holder's live lease: no row */
	fi;
	dropDraw(i);                        /* the DO UPDATE arm, or no row */
	printf("MSC: claim of %d runs, waited %d: row holder %d fence %d expires %d, live %d\n", i, -ct1[i], rh, rf, re, crlive[i]);
	if
	:: crlive[i] -> crf[i] = rf; crm[i] = rm;
		if :: fresh -> issue(rf) :: else -> skip fi
	:: else -> skip                     /* no row, or live = false: nothing */
	fi;
	fresh = 0;
	ct1[i] = 0
}

/* a heartbeat or release (kind k, fence f, ghost mandate m) of replica i runs */
inline roundRuns(i, k, f, m, ok) {
	ok = 0;
	if
	:: k == HB && rx && rh == i + 1 && rf == f && HBLIVE ->
		assert(rm == m);        /* P2: it changes only its own mandate's row */
		assert(!rl);            /* P6: a lapsed lease never comes back */
		re = TTL; rl = 0;
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
		:: ra + MINHOLD > 0 -> re = ra + MINHOLD
		:: else -> re = 0; rl = 1
		fi;
		printf("MSC: release of %d fence %d: row expires %d (not flushed)\n", i, f, re);
#endif
		ok = 1                  /* synchronous_commit off: not flushed */
	:: else -> printf("MSC: heartbeat or release of %d fence %d matches no row\n", i, f)
	fi
}

/* the lease of replica i has ended; what nothing reads any more is cleared */
inline ends(i) {
	al[i] = 0; lrel[i] = 0; tr[i] = 0;
	if :: !unrel[i] -> lf[i] = 0; lm[i] = 0 :: else -> skip fi
}

inline clearRound(i) {
	rst[i] = IDLE; rk[i] = 0; rcur[i] = 0; rfe[i] = 0; rmi[i] = 0; rsent[i] = 0; rok[i] = 0
}

inline clearClaim(i) {
	dropDraw(i);
	cst[i] = IDLE; csent[i] = 0; ct1[i] = 0; crlive[i] = 0; crf[i] = 0; crm[i] = 0; cstall[i] = 0
}

/* the client of replica i stops waiting for its heartbeat or release: the
 * request may still run later, or it was lost, or its reply was */
inline roundGivesUp(i) {
	if
	:: rst[i] == NET && ost == IDLE ->
		ost = NET; oi = i; okd = rk[i]; ofe = rfe[i]; omi = rmi[i]
	:: else -> skip
	fi;
	if
	:: rk[i] == REL && rcur[i] && lrel[i] -> ends(i)     /* ended with the error */
	:: else -> skip
	fi;
	clearRound(i)
}

/* a replica's clock moves by d during a server tick */
inline localTick(i, d) {
	tr[i] = max(tr[i] - d, 0);
	if :: cst[i] != IDLE -> csent[i] = max(csent[i] - d, LOWS) :: else -> skip fi;
	if :: rst[i] != IDLE && rk[i] == HB -> rsent[i] = max(rsent[i] - d, LOWS) :: else -> skip fi
}

inline tick() {
	if
	:: healed && !claimedHealed ->
		/* P4: after healing, the key does not stay unused for W ticks */
		if
		:: B(0) || B(1) || claimedTick -> idle = 0
		:: else -> idle++
		fi;
		assert(idle < W)
	:: else -> skip
	fi;
	tried0 = 0; claimedTick = 0;
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
	for (j : 0 .. N - 1) {
		if :: cst[j] == WAIT -> ct1[j] = max(ct1[j] - 1, LOWT1) :: else -> skip fi;
		if :: cst[j] == STALLED -> ct1[j] = max(ct1[j] - 1, LOWT1); cstall[j]++ :: else -> skip fi;
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

/* ---- a replica: its Locker and the code that calls it ---- */
proctype replica(byte i)
{
	do
	:: if
	   /* Claim: one statement */
	   :: atomic {
		cst[i] == IDLE &&
		(healed && i == 0 && !tried0 && !claimedHealed ||
		 !healed && mids + (cst[0] != IDLE) + (cst[1] != IDLE) < MAXMID) ->
		cst[i] = NET; csent[i] = 0;
		printf("MSC: %d sends a claim\n", i)
	   }
	   /* its reply */
	   :: atomic {
		cst[i] == REP ->
		if
		:: crlive[i] ->
			/* register: the newest lease; the previous one is lost */
			if
			:: unrel[i] -> pf[i] = lf[i]; pm[i] = lm[i]
			:: else -> skip
			fi;
			rcur[i] = 0;
			al[i] = 1; lf[i] = crf[i]; lm[i] = crm[i]; tr[i] = max(csent[i] + TTL, 0);
			lrel[i] = 0; unrel[i] = 1;
			claimedTick = 1; claimedHealed = healed;
			printf("MSC: %d holds fence %d, trust %d\n", i, lf[i], tr[i]);
			P1
		:: else -> skip     /* ErrHeld, or the row came back expired */
		fi;
		tried0 = tried0 || healed && i == 0;
		clearClaim(i)
	   }
	   /* a heartbeat round: a lease held and within its trust deadline */
	   :: atomic {
		rst[i] == IDLE && al[i] && !lrel[i] && tr[i] > 0 ->
		rst[i] = NET; rk[i] = HB; rcur[i] = 1; rfe[i] = lf[i]; rmi[i] = lm[i]; rsent[i] = 0;
		printf("MSC: %d sends a heartbeat for fence %d\n", i, lf[i])
	   }
	   /* its reply */
	   :: atomic {
		rst[i] == REP && rk[i] == HB ->
		if
		:: rcur[i] && al[i] && rok[i] ->
			tr[i] = max(rsent[i] + TTL, 0);
			printf("MSC: %d extended, trust %d\n", i, tr[i]);
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
		rst[i] = NET; rk[i] = REL; rcur[i] = 1; rfe[i] = lf[i]; rmi[i] = lm[i];
		if :: !al[i] -> lf[i] = 0; lm[i] = 0; rcur[i] = 0 :: else -> skip fi
	   }
	   /* a late Unlock of a lease superseded by a re-entrant claim */
	   :: atomic {
		rst[i] == IDLE && pf[i] != 0 ->
		printf("MSC: %d unlocks superseded fence %d\n", i, pf[i]);
		rst[i] = NET; rk[i] = REL; rcur[i] = 0; rfe[i] = pf[i]; rmi[i] = pm[i];
		pf[i] = 0; pm[i] = 0
	   }
	   /* the release's reply: the lease has ended */
	   :: atomic {
		rst[i] == REP && rk[i] == REL ->
		if :: rcur[i] && lrel[i] -> ends(i); printf("MSC: %d released\n", i) :: else -> skip fi;
		clearRound(i)
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
	   /* a claim or its reply is lost (a client that gives up on a claim
	    * cannot tell it from a lost reply; it claims again only once the
	    * statement has run or is lost: one claim in flight) */
	   :: atomic {
		!healed && (cst[i] == NET || cst[i] == REP) ->
		printf("MSC: claim of %d or its reply lost\n", i);
		clearClaim(i)
	   }
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
	   /* a claim arrives: its VALUES are evaluated now (t1), drawing the
	    * INSERT arm's fence; it may stall before it reaches the row */
	   :: atomic {
		cst[i] == NET -> ct1[i] = 0; cst[i] = STALLED; cstall[i] = 0;
#ifndef VARIANT_A
		seq++; cvf[i] = seq;
#endif
		printf("MSC: claim of %d arrives (VALUES evaluated, fence %d drawn)\n", i, cvf[i])
	   }
	   /* it reaches the row, and queues on the row lock */
	   :: atomic {
		cst[i] == STALLED -> wq[wn] = i; wn++; cst[i] = WAIT; cstall[i] = 0;
		printf("MSC: claim of %d reaches the row\n", i)
	   }
	   /* a heartbeat or release runs (not past its own replica's stalled
	    * claim: that is LIMIT_OVERTAKE) */
	   :: atomic {
		NOWAIT && OWNNOWAIT(i) && rst[i] == NET ->
		roundRuns(i, rk[i], rfe[i], rmi[i], okv);
		rok[i] = okv && rk[i] == HB; okv = 0; rst[i] = REP
	   }
	   fi
	od
}

/* ---- time, the row lock, Migrate, the WAL, crashes, healing ---- */
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
		 rst[0] == IDLE && rst[1] != NET && ost == IDLE &&
		 (tried0 || B(0) || claimedHealed))) ->
		tick()
	   }
	   /* the claim at the head of the row-lock queue runs */
	   :: atomic {
		wn > 0 ->
		i = wq[0]; wq[0] = wq[1]; wq[1] = 0; wn--;
		claimRuns(i);
		cst[i] = REP;
		i = 0
	   }
	   /* the statement a client gave up on runs, or is lost */
	   :: atomic {
		NOWAIT && OWNNOWAIT(oi) && ost == NET ->
		printf("MSC: a statement nobody waits for runs\n");
		roundRuns(oi, okd, ofe, omi, okv);
		okv = 0; ost = IDLE; oi = 0; okd = 0; ofe = 0; omi = 0
	   }
	   :: atomic {
		!healed && ost == NET -> ost = IDLE; oi = 0; okd = 0; ofe = 0; omi = 0
	   }
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
		wn = 0; wq[0] = 0; wq[1] = 0;
		for (j : 0 .. N - 1) {
			if :: cst[j] != IDLE -> clearClaim(j) :: else -> skip fi;
			if :: rst[j] != IDLE -> roundGivesUp(j) :: else -> skip fi
		};
		j = 0;
		ost = IDLE; oi = 0; okd = 0; ofe = 0; omi = 0
	   }
	   /* the network heals for good, and replica 0 keeps running: its
	    * statements and everyone's requests are answered within the tick */
	   :: atomic {
		!healed -> healed = 1; tried0 = 0; claimedTick = 0; idle = 0; printf("MSC: healed\n")
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
