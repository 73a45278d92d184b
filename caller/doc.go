// Package caller is the client's half of the idempotency-key contract: it
// sends a request to an endpoint that honours the Idempotency-Key header (an
// atomicphase handler, Stripe, or any endpoint following the IETF
// draft-ietf-httpapi-idempotency-key-header), and retries it under one key
// until it holds an answer the server will not change, or says that the
// outcome is unknown and which key to retry with later.
//
//	c, err := caller.New(caller.Config{})
//	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
//	res, err := c.Do(req)
//	var unknown *caller.UnknownOutcomeError
//	switch {
//	case errors.As(err, &unknown):
//		// Keep unknown.Key; send the request again with it later.
//	case err != nil:
//		// Nothing was sent: a bad request or body.
//	default:
//		defer res.Body.Close()
//		// res.StatusCode is the answer; res.Replayed, res.Attempts, res.Key.
//	}
//
// A Client is also an http.RoundTripper, so http.Client{Transport: c}
// retries the same way (and follows redirects); Do alone tells the key,
// the attempts and whether the answer was replayed.
//
// # Rules
//
// Every choice the client makes, in one table:
//
//	Choice                 Rule
//	---------------------  -----------------------------------------------------------------
//	methods                GET, HEAD, OPTIONS, TRACE: sent once, as they are, no key added.
//	                       Every other method: keyed and retried as below.
//	key                    The request's own Idempotency-Key header, sent verbatim (quote it
//	                       yourself for a strict RFC 8941 server); else NewKey: a UUIDv7,
//	                       sent bare, as Stripe and most servers expect. One key for all
//	                       the attempts of a request.
//	body                   Re-sent from req.GetBody; a body without GetBody is buffered,
//	                       up to MaxBodyBytes (1 MiB), else Do fails before sending.
//	transport errors       Retried, whether or not the request was written: the key makes
//	                       a second delivery harmless. Not retried: certificate errors.
//	409 Conflict           Retried after Retry-After when it is given: the key's first
//	                       request is still in flight (or on hold).
//	429, 503               Retried after Retry-After when it is given.
//	408, 425, 502, 504     Retried.
//	500                    Retried. An atomicphase handler answers 500 for a failed phase
//	                       and stores nothing: the retry resumes after the last committed
//	                       phase. Stripe stores a 500 and replays it, marked
//	                       Idempotent-Replayed and Stripe-Should-Retry: false, so the
//	                       rules below return it without a second retry. A 500 that
//	                       persists ends as an unknown outcome: the key is unfinished.
//	501, 505, other 5xx    Returned: the server cannot serve the request at all.
//	Retry-After            delay-seconds or an HTTP-date; honoured on every response that
//	                       another attempt follows (a retried status, a 202 being polled,
//	                       Stripe-Should-Retry: true) as the least pause before it, even
//	                       beyond MaxDelay. A pause that would end past MaxElapsed or the
//	                       request's deadline ends the request at once, without sleeping,
//	                       as an unknown outcome.
//	replays                A response with Idempotent-Replayed: true is returned, whatever
//	                       its status: it is the key's stored answer and will not change.
//	400 401 403 404 405    Returned, never retried: the request itself is wrong, and
//	413 415 422, other 4xx sending it again cannot help. 422 (or Stripe's 400) also says
//	                       the key was used with another request.
//	202 with Location      Followed: the request goes on in the background, and its status
//	                       is polled with GET at Location (the request's headers and key,
//	                       no body), each after the previous answer's Retry-After or,
//	                       without one, the backoff, until an answer other than 202.
//	                       Polls are attempts, bounded by MaxElapsed only.
//	2xx, 3xx               Returned (a 202 without Location too).
//	Stripe-Should-Retry    "true" retries the response, "false" returns it, whatever its
//	                       status.
//	backoff                Full jitter: a uniform pause in [0, BaseDelay·2^(n-1)], capped
//	                       at MaxDelay (100 ms doubling to 5 s), or Retry-After if longer.
//	budget                 MaxAttempts (8) attempts and MaxElapsed (30 s) for the whole
//	                       request, body reading included, under the request's context.
//	budget runs out        *UnknownOutcomeError with the key, the attempts, the last status
//	                       or error, and ErrBudgetExhausted (or the context's error) as
//	                       its cause. A retried response is never returned as the answer.
//	409 with Retry-After   Polled after the Retry-After: the key is in flight. Like 202
//	                       polls, bounded by MaxElapsed only, not MaxAttempts.
//	caller's context ends  *UnknownOutcomeError as above, its cause context.Canceled or
//	                       context.DeadlineExceeded. A context that had ended before the
//	                       request was sent gets a plain error: nothing was sent.
//	body cut short         Reading Body returns an *UnknownOutcomeError with the key.
//	report                 Response.Key, Response.Attempts, Response.Replayed;
//	                       Config.Observe sees every attempt.
//
// Go's own http.Transport also re-sends, once, a request carrying an
// Idempotency-Key when a reused keep-alive connection fails before any
// byte of the answer; such a re-send is inside one attempt here.
package caller
