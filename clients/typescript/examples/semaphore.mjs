// A semaphore: at most 4 encoders at once, each in its own slot.
import { connect } from 'baton-locks';

const servers = (process.env.BATON_SERVERS ?? '127.0.0.1:7373').split(',');
const client = connect(servers);
const grant = await client.acquire('encoders', { leaseMs: 60_000, waitMs: 5_000, limit: 4, value: 'host-a' });
try {
  console.log(`encoder slot ${grant.slot} of 4, token ${grant.token}`);
  const status = await client.query('encoders');
  console.log(`newest token ${status.token}, ${status.waiting} waiting`);
} finally {
  await grant.release();
  await client.close();
}
