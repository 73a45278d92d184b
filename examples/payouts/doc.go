// Package payouts is the River recipe of package consume, in its tests: a
// River worker that runs a payout workflow once per job, under the job's
// id, and snoozes, cancels or completes the job as consume.Run's verdict
// says. A job River runs again (a retry after an error, a rescue after its
// worker died) resumes the workflow; one whose workflow finished replays
// it and completes.
package payouts
