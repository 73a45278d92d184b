package protophase

import (
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/protobuf/proto"

	"github.com/atomicphase/atomicphase/keyrow"
)

// ReplyResponse and FailResponse return what Reply and Fail store.
func ReplyResponse(m proto.Message) *keyrow.Response { r := reply(m); return &r }

func FailResponse(c code.Code, message string, details ...proto.Message) *keyrow.Response {
	r := fail(c, message, details...)
	return &r
}
