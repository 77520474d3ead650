-- Gives the writer's lease up, if this instance holds it.
-- KEYS: lease
-- ARGV: holder
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
