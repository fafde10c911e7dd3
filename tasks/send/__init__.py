"""The send path, in one room: everything between a claimed delivery row and its recorded outcome.

| module        | holds                                                                             |
| ------------- | --------------------------------------------------------------------------------- |
| `sequence`    | one batch's send sequence: claim, prepare, reconcile, begin the send, call, record |
| `pool`        | the adaptive sender pool: threads, per-channel pace, the hard deadline per call    |
| `outcomes`    | settling a row: failed (retry or fail), unknown (reconcile, resend or hold)       |
| `group`       | group commit of "sent" records (one conditional UPDATE for many sends)            |
| `retry`       | the retry policy: data plus one pure function                                     |
| `rate`        | send outcomes per channel per minute in Redis (what the rate-drop alert reads)     |
| `connection`  | the per-thread, auto-committing database connection a sender writes through       |

The Celery task that enters it (`clarion.deliver`) lives in tasks/deliver.py, beside the others.
"""
