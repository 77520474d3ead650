-- Gives the compactor's lock up, if this instance still holds it.
-- KEYS: compactor's lock
-- ARGV: holder
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
