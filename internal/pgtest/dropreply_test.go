package pgtest

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/require"
)

// TestDropReplyFindsTheEndOfTheReply: the reply is read up to the
// ReadyForQuery that ends its transaction, and no further.
func TestDropReplyFindsTheEndOfTheReply(t *testing.T) {
	encode := func(msgs ...pgproto3.BackendMessage) []byte {
		var b []byte
		for _, m := range msgs {
			var err error
			b, err = m.Encode(b)
			require.NoError(t, err)
		}
		return b
	}
	whole := encode(&pgproto3.ParseComplete{}, &pgproto3.BindComplete{}, &pgproto3.DataRow{Values: [][]byte{[]byte("1")}},
		&pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	require.True(t, ready(whole))
	require.False(t, ready(whole[:len(whole)-1]), "its ReadyForQuery cut short")
	require.False(t, ready(encode(&pgproto3.ParseComplete{}, &pgproto3.BindComplete{})), "no ReadyForQuery yet")
}
