"""The qshare preemptor: reacts to card busy/idle events with what one card cannot see (gang
suspension, operator suspend/resume, starvation) and records every preemption."""
