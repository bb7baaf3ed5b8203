#!/usr/bin/env bash
# Model-checks the lease protocol (model/lease.pml) with spin.
#
#   bash model/check.sh              the correct model must satisfy every
#                                    property; each buggy variant and each
#                                    limit must produce a counterexample
#   bash model/check.sh trail NAME   the shortest counterexample of one run,
#                                    e.g. VARIANT_B or LIMIT_OVERTAKE
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

# Bounds of every run: two replicas, one key, TTL 3 ticks, retention 1 tick,
# a claim stalls at most 1 tick after drawing its fence (2 in LIMIT_HORIZON),
# at most 3 mandates before the network heals. Time itself is unbounded.
common=(-DMAXMID=3)

# build DIR FLAGS...: generate and compile a verifier in DIR.
build() {
	local dir=$1
	shift
	mkdir -p "$dir"
	cp "$model" "$dir/lease.pml"
	(cd "$dir" && spin "$@" -a lease.pml >/dev/null && gcc -O2 -w "${cflags[@]}" -o pan pan.c)
}

if [ "${1:-}" = trail ]; then
	name=${2:?usage: check.sh trail VARIANT_x|LIMIT_x}
	flags=("-D$name")
	[ "$name" = LIMIT_W_TTL ] && flags=(-DW=3)
	[ "$name" = LIMIT_HORIZON ] && flags=(-DSTALLMAX=2 -DMINHOLD=0)
	cflags=(-DSAFETY -DBFS)
	build "$work/trail" "${common[@]}" "${flags[@]}"
	cd "$work/trail"
	./pan -m1000000 -n | grep -E '^pan:[0-9]' || { echo "check: $name has no counterexample" >&2; exit 1; }
	spin "${common[@]}" "${flags[@]}" -t lease.pml | grep -E 'MSC:|assertion' | sed 's/^ *//; s/^MSC: //'
	exit 0
fi

failed=0

# verify NAME EXPECT PATTERN FLAGS...: run one verification. EXPECT is
# "holds" (no error, complete search) or "fails" (an assertion matching
# PATTERN is violated).
verify() {
	local name=$1 expect=$2 pattern=$3
	shift 3
	local dir="$work/$name" out
	build "$dir" "${common[@]}" "$@"
	out=$(cd "$dir" && ./pan -m1000000 -n 2>&1) || true
	printf '%s\n' "$out" >"$dir/pan.out"
	local states depth secs errors violated
	states=$(sed -n 's/^ *\([0-9e+.]*\) states, stored.*/\1/p' <<<"$out")
	depth=$(sed -n 's/.*depth reached \([0-9]*\).*/\1/p' <<<"$out")
	secs=$(sed -n 's/^pan: elapsed time \([0-9.e+]*\) seconds.*/\1/p' <<<"$out")
	errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' <<<"$out")
	violated=$(sed -n 's/^pan:1: \(.*\) (at depth.*/\1/p' <<<"$out")
	local verdict ok=1
	case $expect in
	holds)
		if [ "$errors" = 0 ] && ! grep -qE 'max search depth too small|out of memory|search not completed' <<<"$out"; then
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
	printf '%-22s %10s states  depth %6s  %6ss  %s\n' "$name" "${states:-?}" "${depth:-?}" "${secs:-?}" "$verdict"
	if [ "$ok" = 0 ]; then
		failed=1
		grep -E '^pan:|errors:|states, stored' "$dir/pan.out" | sed 's/^ */    /'
		echo "    (bash model/check.sh trail $name prints the shortest counterexample)"
	fi
}

cflags=(-DSAFETY -DCOLLAPSE)
echo "check: spin $(spin -V | sed -n 's/Spin Version \([^ ]*\).*/\1/p'), TTL 3 ticks, retention 1 tick, stalls up to 1 tick, 2 replicas, 1 key, up to 3 mandates"

# The correct protocol, with a min hold and without, one per core.
verify correct-minhold-2 holds "" -DMINHOLD=2 >"$work/a.txt" &
pa=$!
verify correct-minhold-0 holds "" -DMINHOLD=0 >"$work/b.txt" &
pb=$!
wait "$pa" || true
wait "$pb" || true
cat "$work/a.txt" "$work/b.txt"
grep -q FAILED "$work/a.txt" "$work/b.txt" && failed=1

# Known mistakes: each must be caught.
verify VARIANT_A fails 'rf>lastf' -DVARIANT_A           # P3: fence restarts after DELETE
verify VARIANT_B fails 'rm==' -DVARIANT_B               # P2: late statement of the previous mandate
verify VARIANT_C fails 'ct1[i]+3)>0' -DVARIANT_C        # P5: CHECK violated after a wait
verify VARIANT_D fails '!(rl)' -DVARIANT_D              # P6: a lapsed lease revived

# Where the guarantees end: each must show its counterexample.
verify LIMIT_SLOW_CLOCK fails 'al[0]' -DLIMIT_SLOW_CLOCK          # P1 needs clocks no slower than the server's
verify LIMIT_RELEASE_WINDOW fails 'al[0]' -DLIMIT_RELEASE_WINDOW  # P1 counts a lease being released as held
verify LIMIT_OVERTAKE fails 'al[0]' -DLIMIT_OVERTAKE              # P1 needs the row lock served in order
verify LIMIT_W_TTL fails 'idle<' -DW=3                            # P4's bound of TTL + 1 ticks is tight
verify LIMIT_HORIZON fails 'rf>lastf' -DSTALLMAX=2 -DMINHOLD=0     # P3 needs a purge horizon longer than any stall

if [ "$failed" != 0 ]; then
	echo "check: FAILED"
	exit 1
fi
echo "check: ok (correct model verified; every variant and limit has its counterexample)"
