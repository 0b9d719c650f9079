//! The virtqueue walkthrough (`examples/virtqueue_walk.rs`): its steps
//! come in order, and each shows the ring facts its text claims, read
//! back from guest memory; and the ring trace of the walk decodes to the
//! same story.

use pier_device::RingTrace;
use pier_device::device::{EVENT_QUEUE, LifecycleEvent, RX_QUEUE, TX_QUEUE, status};
use pier_device::ring_trace::read::{self, Event};
use pier_device::testing::walk::{self, Owner, RingView, Step, StepKind, vring_need_event};

const RX_BUFFERS: u16 = 4;

/// The ring of `queue` as `step` shows it; panics if the step left it
/// unchanged (and so did not show it).
fn ring(step: &Step, queue: usize) -> &RingView {
    step.rings
        .iter()
        .find(|r| r.queue == queue)
        .unwrap_or_else(|| panic!("{:?} does not show queue {queue}", step.kind))
}

fn statuses(step: &Step) -> Vec<u32> {
    step.lifecycle
        .iter()
        .filter_map(|e| match e {
            LifecycleEvent::Status { now, .. } => Some(*now),
            LifecycleEvent::QueueLive(_) => None,
        })
        .collect()
}

fn packet(ring: &RingView, index: usize) -> &str {
    ring.chains[index].packet.as_deref().unwrap_or("")
}

#[test]
fn the_walkthrough_shows_each_step_with_its_ring_facts() {
    let steps = walk::walk().expect("testbed");
    let kinds: Vec<StepKind> = steps.iter().map(|s| s.kind).collect();
    // Fifteen steps, each later in the declaration than the one before:
    // every kind once, in the order `StepKind` declares.
    assert_eq!(kinds.len(), 15, "{kinds:?}");
    assert!(kinds.windows(2).all(|w| w[0] < w[1]), "out of order: {kinds:?}");
    use StepKind::*;
    let step = |kind| steps.iter().find(|s| s.kind == kind).expect("step");
    let (ack, driver, features_ok, driver_ok) =
        (status::ACKNOWLEDGE, status::DRIVER, status::FEATURES_OK, status::DRIVER_OK);

    // Initialisation, in the order 3.1.1 gives, as the device saw it.
    assert_eq!(statuses(step(Initialisation)), [0, ack | driver, ack | driver | features_ok]);
    assert_eq!(
        step(QueueSetup).lifecycle,
        [RX_QUEUE, TX_QUEUE, EVENT_QUEUE].map(LifecycleEvent::QueueLive)
    );
    let posted = step(BuffersPosted);
    assert_eq!(statuses(posted), [ack | driver | features_ok | driver_ok]);
    assert_eq!(posted.kicks, [true, false, true], "rx and event kicked, not tx");
    let rx = ring(posted, RX_QUEUE);
    assert_eq!((rx.avail_idx, rx.used_idx, rx.chains.len()), (RX_BUFFERS, 0, 4));
    assert!(rx.chains.iter().all(|c| c.owner == Owner::DeviceToTake
        && c.descriptors.len() == 1
        && c.descriptors[0].flags == 2));
    assert_eq!(ring(posted, EVENT_QUEUE).avail_idx, 8);

    // The REQUEST: one header-only descriptor, published and kicked.
    let request = step(Request);
    assert!(request.kicks[TX_QUEUE]);
    let tx = ring(request, TX_QUEUE);
    assert_eq!((tx.avail_idx, tx.used_idx), (1, 0));
    assert_eq!(tx.chains[0].owner, Owner::DeviceToTake);
    assert_eq!((tx.chains[0].descriptors[0].len, tx.chains[0].descriptors[0].flags), (44, 0));
    assert!(packet(tx, 0).contains("REQUEST"), "{}", packet(tx, 0));

    // The RESPONSE: both queues' used indices move, an interrupt each.
    let response = step(Response);
    let (tx, rx) = (ring(response, TX_QUEUE), ring(response, RX_QUEUE));
    assert_eq!((tx.used_idx, tx.chains[0].used_len), (1, Some(0)));
    assert_eq!((rx.used_idx, rx.chains[0].used_len), (1, Some(44)));
    assert_eq!(rx.chains[0].owner, Owner::DriverToTake);
    assert!(packet(rx, 0).contains("RESPONSE"), "{}", packet(rx, 0));
    assert_eq!(response.interrupts, 2);

    let taken = step(ResponseTaken);
    let rx = ring(taken, RX_QUEUE);
    assert_eq!((rx.used_event, rx.avail_idx), (1, RX_BUFFERS + 1), "taken back and reposted");
    assert!(taken.kicks[RX_QUEUE]);
    assert!(ring(taken, TX_QUEUE).chains.is_empty());

    // The data packet: header, then payload, chained with NEXT.
    let data = ring(step(DataPublished), TX_QUEUE);
    let d = &data.chains[0].descriptors;
    assert_eq!((d.len(), d[0].len, d[0].flags, d[0].next), (2, 44, 1, d[1].index));
    assert_eq!((d[1].len, d[1].flags), (13, 0));
    assert_eq!(ring(step(DataTaken), TX_QUEUE).used_idx, 2);

    let credit = step(CreditUpdate);
    let rx = ring(credit, RX_QUEUE);
    assert!(packet(rx, 0).contains("CREDIT_UPDATE"), "{}", packet(rx, 0));
    assert_eq!((rx.used_idx, credit.interrupts), (2, 1));

    // used_event stays behind: the next used entry raises no interrupt.
    let suppressed = step(InterruptSuppressed);
    let rx = ring(suppressed, RX_QUEUE);
    assert_eq!((rx.used_idx, rx.used_event, suppressed.interrupts), (3, 1, 0));

    // The second publication: the spec's rule says no kick; the driver kicks.
    let second = step(SecondKick);
    let tx = ring(second, TX_QUEUE);
    assert_eq!(tx.chains.len(), 2, "two packets waiting for the device");
    assert!(!vring_need_event(tx.avail_event, tx.avail_idx, tx.avail_idx - 1));
    assert!(second.kicks[TX_QUEUE], "virtio-drivers 0.13 kicks every publication");

    // The dry ring: every buffer used, the device asks for the next kick.
    let dry = step(RxRingDry);
    let rx = ring(dry, RX_QUEUE);
    assert_eq!(rx.chains.len(), 4);
    assert!(rx.chains.iter().all(|c| c.owner == Owner::DriverToTake));
    assert_eq!((rx.device_next_avail, rx.avail_event), (rx.avail_idx, rx.avail_idx));
    let refilled = step(RxRefilled);
    let again = ring(refilled, RX_QUEUE);
    assert_eq!(again.avail_idx, rx.avail_idx + RX_BUFFERS);
    assert!(refilled.kicks[RX_QUEUE]);
    assert!(vring_need_event(again.avail_event, again.avail_idx, rx.avail_idx));
    let delivered = step(WaitingDelivered);
    assert_eq!(ring(delivered, RX_QUEUE).used_idx, rx.used_idx + 1);
    assert_eq!(delivered.interrupts, 1);

    // The reset: status 0, then the whole initialisation again.
    let reset = step(Reset);
    let written = statuses(reset);
    assert_eq!(written.first(), Some(&0));
    assert_eq!(written.last(), Some(&(ack | driver | features_ok | driver_ok)));
    let (rx, tx) = (ring(reset, RX_QUEUE), ring(reset, TX_QUEUE));
    assert_eq!((rx.avail_idx, rx.used_idx, tx.avail_idx, tx.used_idx), (RX_BUFFERS, 0, 0, 0));

    // Every line fits an 80-column terminal.
    let text = walk::render(&steps);
    let long: Vec<&str> = text.lines().filter(|l| l.chars().count() > 80).collect();
    assert!(long.is_empty(), "lines over 80 columns: {long:#?}");
}

/// The packets a trace shows returned, as (queue, op), in order.
fn carried(trace: &read::Trace) -> Vec<(usize, u16)> {
    trace
        .records
        .iter()
        .filter_map(|r| match &r.event {
            Event::Used { q, header: Some(h), .. } => {
                Some((*q, pier_stack::wire::RawHeader::parse(h).expect("a header").op))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn the_walkthroughs_ring_trace_decodes_to_its_sequence_of_queue_events() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("walk.jsonl");
    let (recorder, handle) = RingTrace::create(&path).unwrap();
    let steps = walk::walk_traced(Some(recorder)).expect("testbed");
    let report = handle.finish();
    let trace = read::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!((report.0.written, report.0.dropped), (trace.records.len() as u64, 0));
    assert_eq!(trace.missing, 0);
    let names: Vec<&str> = trace.records.iter().map(|r| r.event.name()).collect();

    // Initialisation in 3.1.1's order: reset, ACKNOWLEDGE|DRIVER, the
    // features and FEATURES_OK, each queue, DRIVER_OK.
    assert_eq!(
        names[..9],
        ["reset", "status", "status", "features", "status", "queue", "queue", "queue", "status"]
    );
    let Event::Features { accepted: true, .. } = trace.records[3].event else {
        panic!("{:?}", trace.records[3])
    };

    // The walk's packets, in the order the device returned them: the
    // REQUEST and RESPONSE, the data packet, the host's credit update,
    // the ping, the guest's credit update, "one" and "two", the host's
    // credit update, then the five messages for four rx buffers.
    const REQUEST: u16 = 1;
    const RESPONSE: u16 = 2;
    const RW: u16 = 5;
    const CREDIT_UPDATE: u16 = 6;
    let (rx, tx) = (RX_QUEUE, TX_QUEUE);
    let mut expected = vec![
        (tx, REQUEST),
        (rx, RESPONSE),
        (tx, RW),
        (rx, CREDIT_UPDATE),
        (rx, RW),
        (tx, CREDIT_UPDATE),
        (tx, RW),
        (tx, RW),
        (rx, CREDIT_UPDATE),
    ];
    expected.extend([(rx, RW); 5]);
    assert_eq!(carried(&trace), expected);

    // Every chain the device returned, it took first; every chain it took
    // was published at that position.
    let mut published = std::collections::HashMap::new();
    let mut taken = std::collections::HashMap::new();
    for r in &trace.records {
        match &r.event {
            Event::Avail { q, pos, head, .. } => {
                published.insert((*q, *pos), *head);
            }
            Event::Take { q, pos, head } => {
                assert_eq!(published.get(&(*q, *pos)), Some(head), "{r:?}");
                taken.insert((*q, *head), r.seq);
            }
            Event::Used { q, head, .. } => {
                assert!(taken.remove(&(*q, *head)).is_some(), "returned untaken: {r:?}");
            }
            Event::Reset => {
                published.clear();
                taken.clear();
            }
            _ => {}
        }
    }

    // The interrupt the walk shows suppressed; the reboot: a reset, and
    // the three queues set up again before the next one (the walk's end,
    // when the testbed goes and its driver resets the device as it goes).
    assert!(
        trace
            .records
            .iter()
            .any(|r| matches!(r.event, Event::Irq { q, raised: false, .. } if q == RX_QUEUE))
    );
    let resets: Vec<usize> =
        names.iter().enumerate().filter(|(_, n)| **n == "reset").map(|(i, _)| i).collect();
    let (reboot, teardown) = (resets[1], *resets.last().unwrap());
    assert!(reboot > 9 && reboot < teardown, "{names:?}");
    assert_eq!(names[reboot..teardown].iter().filter(|&&n| n == "queue").count(), 3);

    // Replayed up to the teardown, the trace's rx ring is the one the walk
    // read from guest memory in its last step, as far as the device saw it.
    let mut rings = read::Rings::default();
    for r in &trace.records[..teardown] {
        rings.apply(&r.event);
    }
    let shown = ring(steps.last().unwrap(), RX_QUEUE);
    let replayed = rings.view(RX_QUEUE);
    assert_eq!(
        (replayed.size, replayed.used_idx, replayed.device_next_avail),
        (shown.size, shown.used_idx, shown.device_next_avail)
    );
}
