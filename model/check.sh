#!/usr/bin/env bash
# Model-checks the lease protocol (model/lease.pml) with spin.
#
#   bash model/check.sh              the correct model must satisfy every
#                                    property; each buggy variant and each
#                                    limit must produce a counterexample
#   bash model/check.sh trail NAME   the shortest counterexample of one run,
#                                    e.g. VARIANT_E or LIMIT_OVERTAKE
#
# docs/MODEL.md explains the model, the properties and these runs.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
model="$here/lease.pml"

if ! command -v spin >/dev/null 2>&1; then
	if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "check: installing spin"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq && apt-get install -y -qq spin >/dev/null
	else
		echo "check: spin is not installed. Install it (Debian/Ubuntu: sudo apt-get install spin;" >&2
		echo "       or build it from https://github.com/nimble-code/Spin) and run again." >&2
		exit 2
	fi
fi
if ! command -v gcc >/dev/null 2>&1; then
	echo "check: gcc is needed to compile the verifier (Debian/Ubuntu: sudo apt-get install gcc)" >&2
	exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Bounds. Every run: two replicas, one key, TTL 3 ticks, retention 1 tick,
# a claim stalls at most 1 tick after drawing its fence (2 in LIMIT_HORIZON).
# Time itself is unbounded.
#   base  at most 3 mandates before the network heals; claims on the
#         Locker's TTL only, and a claim given up on never runs later
#   late  at most 2 mandates before the network heals; claims on the
#         Locker's TTL or a job's (1 tick), and every statement given up on
#         may still run later, the give-back included
base=(-DMAXMID=3 -DNOLATE -DNOJOB)
late=(-DMAXMID=2)
# Memory each verifier may use, in MB: past it the search is incomplete,
# which fails the run instead of exhausting the machine.
memlim=${PGLEASE_MODEL_MEMLIM:-6000}

# flags NAME: the spin flags of one run.
flags() {
	case $1 in
	correct-minhold-2) echo "${base[*]} -DMINHOLD=2" ;;
	correct-minhold-0) echo "${base[*]} -DMINHOLD=0" ;;
	correct-late-minhold-2) echo "${late[*]} -DMINHOLD=2" ;;
	correct-late-minhold-0) echo "${late[*]} -DMINHOLD=0" ;;
	VARIANT_A | VARIANT_B | VARIANT_C | VARIANT_D) echo "${base[*]} -D$1" ;;
	VARIANT_E) echo "${late[*]} -DNOJOB -DVARIANT_E" ;;
	VARIANT_F) echo "${late[*]} -DNOLATE -DVARIANT_F" ;;
	LIMIT_SLOW_CLOCK | LIMIT_RELEASE_WINDOW) echo "${base[*]} -D$1" ;;
	LIMIT_OVERTAKE) echo "${base[*]} -DLIMIT_OVERTAKE -DVARIANT_F" ;;
	LIMIT_OVERTAKE_P3) echo "${base[*]} -DLIMIT_OVERTAKE" ;;
	LIMIT_W_TTL) echo "${base[*]} -DW=3" ;;
	LIMIT_HORIZON) echo "${base[*]} -DSTALLMAX=2 -DMINHOLD=0" ;;
	*) return 1 ;;
	esac
}

# build DIR CFLAGS -- SPINFLAGS...: generate and compile a verifier in DIR.
build() {
	local dir=$1 cflags=()
	shift
	while [ "$1" != -- ]; do
		cflags+=("$1")
		shift
	done
	shift
	mkdir -p "$dir"
	cp "$model" "$dir/lease.pml"
	(cd "$dir" && spin "$@" -a lease.pml >/dev/null && gcc -O2 -w "${cflags[@]}" -DMEMLIM="$memlim" -o pan pan.c)
}

if [ "${1:-}" = trail ]; then
	name=${2:?usage: check.sh trail VARIANT_x|LIMIT_x}
	fl=$(flags "$name") || { echo "check: no run named $name" >&2; exit 2; }
	read -r -a f <<<"$fl"
	# Breadth first: the first counterexample is a shortest one.
	build "$work/trail" -DSAFETY -DBFS -DCOLLAPSE -- "${f[@]}"
	cd "$work/trail"
	out=$(./pan -m1000000 -n 2>&1) || true
	if ! grep -qE '^pan:[0-9]' <<<"$out" && grep -q MEMLIM <<<"$out"; then
		# Too broad to search breadth first within the memory limit:
		# depth first finds a counterexample quickly, not a short one.
		echo "check: $name: the breadth-first search needs more than ${memlim} MB" \
			"(PGLEASE_MODEL_MEMLIM); this counterexample is not the shortest" >&2
		gcc -O2 -w -DSAFETY -DMEMLIM="$memlim" -o pan pan.c
		out=$(./pan -m1000000 -n 2>&1) || true
	fi
	grep -E '^pan:[0-9]' <<<"$out" || { echo "check: $name has no counterexample" >&2; exit 1; }
	spin "${f[@]}" -t lease.pml | grep -E 'MSC:|assertion' | sed 's/^ *//; s/^MSC: //'
	exit 0
fi

# verify NAME EXPECT PATTERN: run one verification. EXPECT is "holds" (no
# error, complete search) or "fails" (an assertion matching PATTERN is
# violated). It prints one line, and the details when the run failed.
verify() {
	local name=$1 expect=$2 pattern=$3 f
	local dir="$work/$name" out
	read -r -a f <<<"$(flags "$name")"
	build "$dir" -DSAFETY -DNOBOUNDCHECK -- "${f[@]}"
	out=$(cd "$dir" && ./pan -m1000000 -n -w26 2>&1) || true
	printf '%s\n' "$out" >"$dir/pan.out"
	local states depth secs mb errors violated
	states=$(sed -n 's/^ *\([0-9e+.]*\) states, stored.*/\1/p' <<<"$out")
	depth=$(sed -n 's/.*depth reached \([0-9]*\).*/\1/p' <<<"$out")
	secs=$(sed -n 's/^pan: elapsed time \([0-9.e+]*\) seconds.*/\1/p' <<<"$out")
	mb=$(sed -n 's/^ *\([0-9]*\)\.[0-9]*[[:space:]]*total actual memory usage.*/\1/p' <<<"$out")
	errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' <<<"$out")
	violated=$(sed -n 's/^pan:1: \(.*\) (at depth.*/\1/p' <<<"$out")
	local verdict ok=1
	case $expect in
	holds)
		if [ "$errors" = 0 ] && ! grep -qiE 'max search depth too small|out of memory|search not completed|MEMLIM' <<<"$out"; then
			verdict="holds: no counterexample"
		else
			verdict="FAILED: ${violated:-search incomplete}"
			ok=0
		fi
		;;
	fails)
		if [ "${errors:-0}" != 0 ] && grep -qF -- "$pattern" <<<"$violated"; then
			verdict="counterexample as expected: $violated"
		else
			verdict="FAILED: expected a violation of '$pattern', got '${violated:-none}'"
			ok=0
		fi
		;;
	esac
	printf '%-22s %10s states  depth %6s  %6ss  %6s MB  %s\n' "$name" "${states:-?}" "${depth:-?}" "${secs:-?}" "${mb:-?}" "$verdict"
	if [ "$ok" = 0 ]; then
		grep -iE '^pan:|errors:|states, stored|MEMLIM' "$dir/pan.out" | sed 's/^ */    /'
		echo "    (bash model/check.sh trail $name prints the shortest counterexample)"
		return 1
	fi
}

echo "check: spin $(spin -V | sed -n 's/Spin Version \([^ ]*\).*/\1/p'), TTL 3 ticks (a job's 1), retention 1 tick, stalls up to 1 tick, 2 replicas, 1 key;" \
	"base runs up to 3 mandates, late runs up to 2"

# Every run, longest first; two at a time (one per core), reported in this
# order. NAME EXPECT PATTERN.
runs=(
	# The correct protocol, with a min hold and without.
	"correct-minhold-2 holds -"
	"correct-minhold-0 holds -"
	# ... with late statements, give-backs and jobs' TTLs, fewer mandates.
	"correct-late-minhold-2 holds -"
	"correct-late-minhold-0 holds -"
	# Known mistakes: each must be caught.
	"VARIANT_A fails rf>lastf"       # P3: fence restarts after DELETE
	"VARIANT_B fails rm=="           # P2: late statement of the previous mandate
	"VARIANT_C fails ct1["           # P5: CHECK violated after a wait
	"VARIANT_D fails !(rl)"          # P6: a lapsed lease revived
	"VARIANT_E fails al[0]"          # P1: the old give-back expires a re-claimed row
	"VARIANT_F fails al[0]"          # P1: a job's shorter TTL cuts a trusted lease short
	# Where the guarantees end: each must show its counterexample.
	"LIMIT_SLOW_CLOCK fails al[0]"     # P1 needs clocks no slower than the server's
	"LIMIT_RELEASE_WINDOW fails al[0]" # P1 counts a lease being released as held
	"LIMIT_OVERTAKE fails al[0]"       # P1 (with EXCLUDED.expires_at) needs the row lock served in order
	"LIMIT_OVERTAKE_P3 fails rf>lastf" # P3 needs it too: the purge must not overtake a waiting claim
	"LIMIT_W_TTL fails idle<"          # P4's bound of TTL + 1 ticks is tight
	"LIMIT_HORIZON fails rf>lastf"     # P3 needs a purge horizon longer than any stall
)

for k in "${!runs[@]}"; do
	read -r name expect pattern <<<"${runs[$k]}"
	while [ "$(jobs -rp | wc -l)" -ge 2 ]; do
		wait -n || true
	done
	verify "$name" "$expect" "$pattern" >"$work/$k.txt" 2>&1 &
done

wait
failed=0
for k in "${!runs[@]}"; do
	cat "$work/$k.txt"
	if grep -q FAILED "$work/$k.txt" || ! grep -qE 'holds: no counterexample|counterexample as expected' "$work/$k.txt"; then
		failed=1
	fi
done

if [ "$failed" != 0 ]; then
	echo "check: FAILED"
	exit 1
fi
echo "check: ok (correct model verified; every variant and limit has its counterexample)"
