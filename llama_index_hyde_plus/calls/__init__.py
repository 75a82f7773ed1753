"""The one door for blocking and async calls: deadlines, pools, joining identical
calls, retries, the breaker, timeouts."""
