package ledger

// TransfersWith declares the transfers workflow with more phases between the
// hold and the payout, for tests of a deploy that adds them.
var TransfersWith = transfers
