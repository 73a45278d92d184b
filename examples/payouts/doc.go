// Package payouts is the River recipe of package consume, in its tests: a
// River worker that looks up the merchant that owns a payout's supplier
// and runs a payout workflow once per job, under the job's id, for that
// merchant. It tells River what consume's verdict says: it completes the
// job once the payout's answer is stored, cancels a job that can never
// succeed (an unknown supplier), snoozes one whose key another attempt
// holds, and fails the attempt otherwise (the lookup's store down, the
// bank refusing), so that River's retry policy spaces the attempts and
// discards the job, with each attempt's error, after its MaxAttempts. A
// job River runs again (a retry after an error, a rescue after its worker
// died) resumes the workflow; one whose workflow finished replays it and
// completes.
package payouts
