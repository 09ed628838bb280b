// Kafka's Admin API end to end, against one broker or three: topics, configs, partitions,
// reassignments, preferred leader election, the cluster, ListOffsets for every OffsetSpec,
// DeleteRecords and log dirs, with topics named PREFIX-*. Prints one "name value" line per
// result for the test; a call that fails prints its exception's simple class name.
// Usage: java -cp 'JARS/*' AdminApi.java BOOTSTRAP PREFIX

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.function.BooleanSupplier;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.serialization.StringSerializer;

public class AdminApi {
    static Admin admin;

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], prefix = args[1];
        // A call that would only time out fails in 20 s, not the default minute.
        try (Admin client = Admin.create(Map.of("bootstrap.servers", bootstrap,
                "request.timeout.ms", "15000", "default.api.timeout.ms", "20000"))) {
            admin = client;
            DescribeClusterResult cluster = admin.describeCluster();
            Collection<Node> nodes = cluster.nodes().get();
            Set<Integer> ids = new TreeSet<>();
            for (Node node : nodes) ids.add(node.id());
            print("cluster_nodes", nodes.size());
            print("cluster_id_present", !cluster.clusterId().get().isEmpty());
            print("controller_is_a_node", ids.contains(cluster.controller().get().id()));
            short replicas = (short) Math.min(3, nodes.size());
            topics(prefix, replicas);
            configs(prefix + "-a");
            partitions(prefix + "-a");
            offsets(bootstrap, new TopicPartition(prefix + "-a", 0));
            reassignAndElect(prefix + "-b", ids);
            logDirs(prefix + "-a", ids, replicas);
            edges(prefix, replicas);
            deleteTopics(prefix);
        }
    }

    static void topics(String prefix, short replicas) throws Exception {
        admin.createTopics(List.of(
            new NewTopic(prefix + "-a", 2, replicas).configs(Map.of("retention.ms", "3600000")),
            new NewTopic(prefix + "-b", 1, (short) Math.min(2, replicas)))).all().get();
        print("create_existing", error(admin.createTopics(List.of(new NewTopic(prefix + "-a", 1, replicas))).all()));
        print("create_bad_replication", error(admin.createTopics(List.of(new NewTopic(prefix + "-c", 1, (short) 9))).all()));
        // Brokers learn of new topics in turn: the one asked may list them a moment later.
        waitFor(() -> admin.listTopics().names().get().containsAll(List.of(prefix + "-a", prefix + "-b")), "topics listed");
        print("list_has_created", true);
        waitFor(() -> fullIsr(prefix + "-a") && fullIsr(prefix + "-b"), "full ISRs");
        TopicDescription a = describe(prefix + "-a");
        print("describe_partitions", a.partitions().size());
        print("describe_replicas", a.partitions().get(0).replicas().size());
        print("describe_isr", a.partitions().get(0).isr().size());
        print("describe_internal", a.isInternal());
        print("describe_missing", error(admin.describeTopics(List.of(prefix + "-none")).allTopicNames()));
    }

    static void configs(String topic) throws Exception {
        ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        printConfig("config_initial", resource, "retention.ms");
        printConfig("config_initial", resource, "cleanup.policy");
        admin.incrementalAlterConfigs(Map.of(resource, List.of(
            new AlterConfigOp(new ConfigEntry("retention.ms", "7200000"), AlterConfigOp.OpType.SET),
            new AlterConfigOp(new ConfigEntry("segment.bytes", "1048576"), AlterConfigOp.OpType.SET)))).all().get();
        printAwaited("config_set", resource, "retention.ms", "7200000");
        printAwaited("config_set", resource, "segment.bytes", "1048576");
        admin.incrementalAlterConfigs(Map.of(resource, List.of(
            new AlterConfigOp(new ConfigEntry("retention.ms", ""), AlterConfigOp.OpType.DELETE)))).all().get();
        printAwaited("config_deleted", resource, "retention.ms", "604800000");
        print("config_unknown", error(admin.incrementalAlterConfigs(Map.of(resource, List.of(
            new AlterConfigOp(new ConfigEntry("no.such.config", "1"), AlterConfigOp.OpType.SET)))).all()));
        print("config_bad_value", error(admin.incrementalAlterConfigs(Map.of(resource, List.of(
            new AlterConfigOp(new ConfigEntry("retention.ms", "soon"), AlterConfigOp.OpType.SET)))).all()));
    }

    static void printConfig(String name, ConfigResource resource, String key) throws Exception {
        ConfigEntry entry = config(resource, key);
        print(name + "_" + key, entry.value() + " " + entry.source());
    }

    static ConfigEntry config(ConfigResource resource, String key) throws Exception {
        return admin.describeConfigs(List.of(resource)).all().get().get(resource).get(key);
    }

    /** Waits until a broker describes `key` as `value` and prints what it describes: the
     *  brokers apply a change in turn, the one asked may not have it yet. */
    static void printAwaited(String name, ConfigResource resource, String key, String value) throws Exception {
        ConfigEntry[] seen = {null};
        waitFor(() -> value.equals((seen[0] = config(resource, key)).value()), key + "=" + value);
        print(name + "_" + key, seen[0].value() + " " + seen[0].source());
    }

    static void partitions(String topic) throws Exception {
        admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(3))).all().get();
        waitFor(() -> describe(topic).partitions().size() == 3, "three partitions");
        print("partitions_increased", describe(topic).partitions().size());
        print("partitions_decrease", error(admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(2))).all()));
        print("partitions_same", error(admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(3))).all()));
    }

    static void offsets(String bootstrap, TopicPartition tp) throws Exception {
        Map<String, Object> produce = Map.of(
            "bootstrap.servers", bootstrap, "acks", "all",
            "key.serializer", StringSerializer.class.getName(),
            "value.serializer", StringSerializer.class.getName());
        long base = System.currentTimeMillis() - 60_000;
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(produce)) {
            List<Future<?>> sends = new ArrayList<>();
            for (int i = 0; i < 10; i++) {
                // The largest timestamp is record 6's, so maxTimestamp finds offset 6.
                long timestamp = base + (i == 6 ? 50_000 : i * 1_000);
                sends.add(producer.send(new ProducerRecord<>(tp.topic(), tp.partition(), timestamp, "k", "v" + i)));
            }
            for (Future<?> send : sends) send.get();
        }
        printOffsets("offsets", tp, base);
        long low = admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(4))).lowWatermarks().get(tp).get().lowWatermark();
        print("delete_records_low_watermark", low);
        print("delete_records_beyond", error(admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(99))).all()));
        printOffsets("offsets_after_delete", tp, base);
    }

    static void printOffsets(String name, TopicPartition tp, long base) throws Exception {
        Map<String, OffsetSpec> specs = Map.of(
            "earliest", OffsetSpec.earliest(), "latest", OffsetSpec.latest(),
            "max_timestamp", OffsetSpec.maxTimestamp(), "earliest_local", OffsetSpec.earliestLocal(),
            "latest_tiered", OffsetSpec.latestTiered(), "for_timestamp", OffsetSpec.forTimestamp(base + 2_500));
        for (String spec : new TreeSet<>(specs.keySet())) {
            var info = admin.listOffsets(Map.of(tp, specs.get(spec))).partitionResult(tp).get();
            String timestamp = spec.equals("max_timestamp") ? " " + (info.timestamp() - base) : "";
            print(name + "_" + spec, info.offset() + timestamp);
        }
    }

    static void reassignAndElect(String topic, Set<Integer> ids) throws Exception {
        TopicPartition tp = new TopicPartition(topic, 0);
        TopicPartitionInfo before = describe(topic).partitions().get(0);
        int leader = before.leader().id();
        // The target: a broker that is not a replica yet, first (so preferred), then the leader.
        List<Integer> target = new ArrayList<>();
        for (int id : ids) {
            if (before.replicas().stream().noneMatch(n -> n.id() == id)) {
                target.add(id);
                break;
            }
        }
        target.add(leader);
        admin.alterPartitionReassignments(Map.of(tp, Optional.of(new NewPartitionReassignment(target)))).all().get();
        waitFor(() -> admin.listPartitionReassignments(Set.of(tp)).reassignments().get().isEmpty()
            && replicaIds(describe(topic).partitions().get(0).replicas()).equals(target)
            && describe(topic).partitions().get(0).isr().size() == target.size(), "reassignment done");
        print("reassignment_listed_after", admin.listPartitionReassignments().reassignments().get().size());
        print("reassignment_replicas_moved", replicaIds(describe(topic).partitions().get(0).replicas()).equals(target));
        print("reassignment_unknown_topic", error(admin.alterPartitionReassignments(Map.of(
            new TopicPartition(topic + "-none", 0), Optional.of(new NewPartitionReassignment(target)))).all()));
        print("elect_preferred", error(admin.electLeaders(ElectionType.PREFERRED, Set.of(tp)).all()));
        waitFor(() -> describe(topic).partitions().get(0).leader().id() == target.get(0), "preferred leader");
        print("elect_leader_is_preferred", describe(topic).partitions().get(0).leader().id() == target.get(0));
        print("elect_again", error(admin.electLeaders(ElectionType.PREFERRED, Set.of(tp)).all()));
    }

    /** Calls with arguments Kafka refuses or answers specially. */
    static void edges(String prefix, short replicas) throws Exception {
        String topic = prefix + "-e";
        TopicPartition tp = new TopicPartition(topic, 0), none = new TopicPartition(prefix + "-none", 0);
        print("edge_validate_only", error(admin.createTopics(List.of(new NewTopic(topic, 1, replicas)),
            new org.apache.kafka.clients.admin.CreateTopicsOptions().validateOnly(true)).all()));
        print("edge_validate_only_listed", admin.listTopics().names().get().contains(topic));
        admin.createTopics(List.of(new NewTopic(topic, 1, replicas))).all().get();
        waitFor(() -> fullIsr(topic) && known(tp), "full ISR");
        var empty = Map.of("earliest", OffsetSpec.earliest(), "latest", OffsetSpec.latest(),
            "max_timestamp", OffsetSpec.maxTimestamp(), "for_timestamp", OffsetSpec.forTimestamp(0));
        for (String spec : new TreeSet<>(empty.keySet())) {
            var info = admin.listOffsets(Map.of(tp, empty.get(spec))).partitionResult(tp).get();
            print("edge_empty_" + spec, info.offset() + " " + info.timestamp() + " " + info.leaderEpoch().isPresent());
        }
        print("edge_offsets_unknown", error(admin.listOffsets(Map.of(none, OffsetSpec.latest())).all()));
        print("edge_delete_records_hw", admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(-1))).lowWatermarks().get(tp).get().lowWatermark());
        print("edge_cancel_no_reassignment", error(admin.alterPartitionReassignments(Map.of(tp, Optional.empty())).all()));
        print("edge_reassign_bad_broker", error(admin.alterPartitionReassignments(Map.of(tp, Optional.of(new NewPartitionReassignment(List.of(99))))).all()));
        print("edge_list_reassignments_unknown", admin.listPartitionReassignments(Set.of(none)).reassignments().get().size());
        print("edge_elect_unknown", error(admin.electLeaders(ElectionType.PREFERRED, Set.of(none)).all()));
        print("edge_elect_unclean_not_needed", error(admin.electLeaders(ElectionType.UNCLEAN, Set.of(tp)).all()));
        print("edge_partitions_unknown", error(admin.createPartitions(Map.of(prefix + "-none", NewPartitions.increaseTo(3))).all()));
        print("edge_partitions_validate_only", error(admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(5)),
            new org.apache.kafka.clients.admin.CreatePartitionsOptions().validateOnly(true)).all()));
        print("edge_partitions_after_validate", describe(topic).partitions().size());
        ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        String throttled = "leader.replication.throttled.replicas";
        for (String[] op : new String[][] {{"APPEND", "0:1"}, {"APPEND", "0:2,0:1"}, {"SUBTRACT", "0:1"}}) {
            admin.incrementalAlterConfigs(Map.of(resource, List.of(new AlterConfigOp(
                new ConfigEntry(throttled, op[1]), AlterConfigOp.OpType.valueOf(op[0]))))).all().get();
        }
        printAwaited("edge_append_subtract", resource, throttled, "0:2");
        print("edge_append_not_a_list", error(admin.incrementalAlterConfigs(Map.of(resource, List.of(
            new AlterConfigOp(new ConfigEntry("retention.ms", "1"), AlterConfigOp.OpType.APPEND)))).all()));
        print("edge_config_unknown_topic", error(admin.describeConfigs(List.of(
            new ConfigResource(ConfigResource.Type.TOPIC, prefix + "-none"))).all()));
        print("edge_create_bad_name", error(admin.createTopics(List.of(new NewTopic("bad/name", 1, replicas))).all()));
        print("edge_create_bad_config", error(admin.createTopics(List.of(new NewTopic(prefix + "-f", 1, replicas)
            .configs(Map.of("retention.ms", "soon")))).all()));
        print("edge_create_zero_partitions", error(admin.createTopics(List.of(new NewTopic(prefix + "-g", 0, replicas))).all()));
        admin.deleteTopics(List.of(topic)).all().get();
    }

    static void logDirs(String topic, Set<Integer> ids, short replicas) throws Exception {
        Map<Integer, Map<String, LogDirDescription>> dirs = admin.describeLogDirs(ids).allDescriptions().get();
        int found = 0;
        boolean sized = true;
        for (Map<String, LogDirDescription> byDir : dirs.values()) {
            for (LogDirDescription dir : byDir.values()) {
                for (var entry : dir.replicaInfos().entrySet()) {
                    if (!entry.getKey().topic().equals(topic)) continue;
                    found++;
                    if (entry.getKey().partition() == 0) sized &= entry.getValue().size() > 0;
                }
                sized &= dir.totalBytes().isPresent() && dir.usableBytes().isPresent();
            }
        }
        print("log_dirs_brokers", dirs.size());
        print("log_dirs_replicas", found);
        print("log_dirs_sized", sized);
    }

    static void deleteTopics(String prefix) throws Exception {
        admin.deleteTopics(List.of(prefix + "-a", prefix + "-b")).all().get();
        waitFor(() -> admin.listTopics().names().get().stream().noneMatch(n -> n.startsWith(prefix + "-")), "topics gone");
        print("deleted_listed", false);
        print("delete_missing", error(admin.deleteTopics(List.of(prefix + "-a")).all()));
    }

    static List<Integer> replicaIds(List<Node> nodes) {
        List<Integer> ids = new ArrayList<>();
        for (Node node : nodes) ids.add(node.id());
        return ids;
    }

    static boolean fullIsr(String topic) throws Exception {
        try {
            return describe(topic).partitions().stream()
                .allMatch(p -> p.leader() != null && p.isr().size() == p.replicas().size());
        } catch (ExecutionException e) {
            // A broker may learn of a topic just created after the one that created it.
            if (e.getCause() instanceof UnknownTopicOrPartitionException) return false;
            throw e;
        }
    }

    /** Whether `tp` is known to the brokers the Admin client asks for metadata (a node at
     * random each time, so asked five times): a topic just created reaches the other brokers
     * of a cluster shortly after the one that created it, in Kafka and in tierbroker. */
    static boolean known(TopicPartition tp) throws Exception {
        try {
            for (int i = 0; i < 5; i++) admin.listOffsets(Map.of(tp, OffsetSpec.latest())).partitionResult(tp).get();
            return true;
        } catch (ExecutionException e) {
            if (e.getCause() instanceof UnknownTopicOrPartitionException) return false;
            throw e;
        }
    }

    static TopicDescription describe(String topic) throws Exception {
        return admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
    }

    interface Check { boolean holds() throws Exception; }

    static void waitFor(Check check, String what) throws Exception {
        long deadline = System.currentTimeMillis() + 30_000;
        while (!check.holds()) {
            if (System.currentTimeMillis() > deadline) throw new AssertionError("timed out: " + what);
            Thread.sleep(50);
        }
    }

    /** "ok" if the call succeeds, else its exception's simple class name. */
    static String error(org.apache.kafka.common.KafkaFuture<?> future) throws InterruptedException {
        try {
            future.get();
            return "ok";
        } catch (ExecutionException e) {
            return e.getCause().getClass().getSimpleName();
        }
    }

    static void print(String name, Object value) {
        System.out.println(name + " " + value);
    }
}
