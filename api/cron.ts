export { GET } from '../functions/vercel/cron.js';
