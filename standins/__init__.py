"""Local stand-ins for the providers (Slack, Twilio, SendGrid, FCM, APNs, SMTP, Anthropic) and a
webhook receiver that counts what arrives: what `clarion demo` and the tests send to instead of
the real services. A production process (worker, beat, web, notify) never imports this package."""
