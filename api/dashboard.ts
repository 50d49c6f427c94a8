export { GET, POST } from '../functions/vercel/dashboard.js';
