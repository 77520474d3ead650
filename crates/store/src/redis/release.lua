-- Gives the writer's lease up, if this instance holds it, and wakes the instance whose
-- turn is next, if one is waiting: it blocks on `turn` (one token, gone with the word).
-- KEYS: lease, want, turn
-- ARGV: holder, how long the token lasts (ms)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('DEL', KEYS[3])
    redis.call('RPUSH', KEYS[3], 1)
    redis.call('PEXPIRE', KEYS[3], ARGV[2])
  end
  return 1
end
return 0
