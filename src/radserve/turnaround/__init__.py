"""Predictable turnaround: service times learned from measured stage times, an ETA for
every unfinished job, deadline-risk events before a miss, and a capacity planner (a
discrete-event simulation of the same policy)."""
