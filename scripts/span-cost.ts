/**
 * What one span costs the OpenTelemetry SDK alone, with nothing of outlive:
 * a `process` span with the attributes outlive/otel gives an attempt,
 * started, given its outcome and ended, into a BatchSpanProcessor whose
 * exporter drops what it gets. CPU per span, garbage collection included;
 * docs/benchmarks.md ("Tracing: what outlive/otel costs a drain") sets it
 * against a no-op task's time.
 *
 *   node --import tsx scripts/span-cost.ts [spans]
 */
import { SpanKind } from '@opentelemetry/api';
import { BasicTracerProvider, BatchSpanProcessor, type ReadableSpan, type SpanExporter } from '@opentelemetry/sdk-trace-base';

class DiscardingExporter implements SpanExporter {
  export(_spans: ReadableSpan[], done: (result: { code: number }) => void): void {
    done({ code: 0 });
  }
  async shutdown(): Promise<void> {}
  async forceFlush(): Promise<void> {}
}

const tracer = new BasicTracerProvider({ spanProcessors: [new BatchSpanProcessor(new DiscardingExporter())] }).getTracer('span-cost');
const spans = Number(process.argv[2] ?? 200_000);
for (let round = 1; round <= 3; round++) {
  const cpu = process.cpuUsage();
  for (let i = 0; i < spans; i++) {
    const span = tracer.startSpan('process measure.noop', {
      kind: SpanKind.CONSUMER,
      attributes: {
        'messaging.system': 'outlive',
        'messaging.operation.type': 'process',
        'messaging.operation.name': 'process',
        'messaging.destination.name': 'default',
        'messaging.message.id': String(i),
        'outlive.task.name': 'measure.noop',
        'outlive.attempt': 1,
      },
    });
    span.setAttribute('outlive.outcome', 'succeeded');
    span.end();
    // Let the processor's timer and the exporter run, as between a pass's tasks.
    if (i % 1000 === 999) await new Promise((resolve) => setImmediate(resolve));
  }
  const used = process.cpuUsage(cpu);
  console.log(`round ${round}: ${((used.user + used.system) / spans).toFixed(2)} µs of CPU per span`);
}
