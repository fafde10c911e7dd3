"""Time: zones, calendars and recurrence. Pure functions that take the time as a parameter."""
