-- Extends the compactor's lock, if this instance still holds it: a compaction outlasts the
-- lock's time to live by extending it as it goes on.
-- KEYS: compactor's lock
-- ARGV: holder, time to live (ms)
-- Answers 1, or 0 if another instance holds the lock (or nobody does).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
