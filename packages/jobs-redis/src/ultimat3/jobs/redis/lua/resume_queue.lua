-- resume_queue: claims take the queue again, and the workers are woken for it. ARGV[4] queue.
redis.call('SREM', K_PAUSED, ARGV[4])
announce(ARGV[4])
return 1
