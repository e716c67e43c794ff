// A leader election: campaign, watch the leader, resign.
import { connect } from 'baton-locks';

const servers = (process.env.BATON_SERVERS ?? '127.0.0.1:7373').split(',');
const me = process.env.ME ?? '10.0.0.7:8080';
const client = connect(servers);

// Anyone: each change of leader (ended by the signal).
const stop = new AbortController();
const observing = (async () => {
  for await (const leader of client.observe('scheduler', { signal: stop.signal })) {
    console.log(leader.token === 0n ? 'nobody leads' : `leader: ${leader.value} (token ${leader.token})`);
  }
})();

// A candidate: wait in line until elected; the lease is kept alive.
const leadership = await client.campaign('scheduler', me, { leaseMs: 10_000 });
leadership.on('lost', (why) => console.log(`no longer the leader: ${why.message}`));
console.log(`I lead with token ${leadership.token}`);
console.log('leader now:', (await client.leader('scheduler')).value);
// ... run rounds fenced with leadership.token, stop when leadership.signal aborts ...
await leadership.release(); // resign: the next candidate in line leads
stop.abort();
await observing;
await client.close();
