package pgtest

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/require"
)

// TestArmedFindsTheStatementInAWrite: a write is picked when one of its
// messages, a Parse or a Query, carries a statement of the armed kind, and
// only then.
func TestArmedFindsTheStatementInAWrite(t *testing.T) {
	const claim = `INSERT INTO "lease" (key, holder) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET holder = $2 RETURNING fence`
	kind := StatementKind(claim)
	require.NotEqual(t, "other", kind)
	encode := func(msgs ...pgproto3.FrontendMessage) []byte {
		var b []byte
		for _, m := range msgs {
			var err error
			b, err = m.Encode(b)
			require.NoError(t, err)
		}
		return b
	}
	extended := encode(&pgproto3.Parse{Name: "", Query: claim}, &pgproto3.Bind{}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{})
	require.True(t, carries(extended, kind), "a Parse of the statement, then its run")
	require.True(t, carries(encode(&pgproto3.Query{String: claim}), kind), "a Query of the statement")
	require.False(t, carries(encode(&pgproto3.Query{String: "SELECT 1"}), kind), "another statement")
	require.False(t, carries(encode(&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}), kind), "a run of a statement prepared before")
	require.False(t, carries(extended[:len(extended)/2], kind), "a message cut short")

	h := &armed{kind: kind}
	require.False(t, h.take(extended), "a write before Arm")
	h.Arm()
	require.True(t, h.take(extended), "the first write once armed")
	require.False(t, h.take(extended), "only the first")
}
