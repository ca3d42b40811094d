package bench

import (
	"math/rand/v2"
	"strings"
)

// tokenWordList returns the vocabulary of tokenText: 1586 three-letter
// lowercase words, each one token after a space in the tokenizers of
// Llama-3.1, Qwen3 and DeepSeek-V3 (every such word of the tokenizer.json
// files `make tokenizers` installs; TestTokenTextIsOneTokenPerWord holds
// them to the tokenizers). A new slice on every call.
func tokenWordList() []string { return strings.Fields(tokenWords) }

// tokenText returns tokens words of words (tokenWordList) drawn at random,
// each followed by a space: four characters per token as Text, which is
// what duet's default estimate and duet-sim without a tokenizer count, and
// also one token per word for the model tokenizers above (Text's random
// letters take about 1.9 there), so that a prompt planned at n tokens is n
// tokens for an engine that tokenizes (duet-sim --tokenizer-path) too.
func tokenText(rng *rand.Rand, words []string, tokens int) string {
	b := make([]byte, 0, tokens*charsPerToken)
	for range tokens {
		b = append(b, words[rng.IntN(len(words))]...)
		b = append(b, ' ')
	}
	return string(b)
}

// tokenWords is TokenWords' list, space-separated.
const tokenWords = "" +
	"aan aba abb abc abl abs aby acc ace ach act ada add adj adm ado ads adv aer aes aff afl aft age " +
	"agg ago agr aid ail aim ain air ais aka ako akt aku alb alc ald ale alf alg ali alk all alm als " +
	"alt ama amb ami amo amp ana anc and ang ani ank ann ano ans ant anx any anz aos apa ape aph api " +
	"apl apo app apr apt aqu ara arb arc ard are arg ark arm arr art ary asc ash asi ask ass ast ata " +
	"ate ath atm att auc aud auf aug aur aus aut aux ave avg awe awk axe azt bab bac bad bag bah baj " +
	"bak bal ban bar bas bat bay baz beb bed bee bef beg beh bei bek bel bem ben ber bes bet bev bew " +
	"bey bez bfs bib bic bid bif big bij bik bil bin bio bip bir bis bit biz bla ble bli blo boa bob " +
	"bod bog bol bom bon bor bos bot bou bow box boy bra bre bro bru btn bud buf bug bul bum bun bur " +
	"bus but buy buz bye bzw cab cac cad caf cal cam can cap car cas cat cav cel cen cer ces cet cfg " +
	"cha che chi cho chr chu cic cif cig cil cin cir cis cit civ cle clo cls cmd cmp cnt cob coc cod " +
	"cog col com con cop cor cos cot cou cov cow coy cpu cra cre cri cro cru cry css csv ctx cub cuc " +
	"cue cui cuk cul cum cup cur cut cyl cyn cyt czy dab dad dag dah dai dak dal dam dan dao dar das " +
	"dat dau dav day deb dec ded def deg dei dej del dem den dep der des det dev dew dex dez dfs dia " +
	"dib dic did die dif dig dik dil dim din dio dip dir dis dit div diz dla dna dni dob doc dod doe " +
	"dog doi dok dol dom don dop dor dos dot dou dov dow dps dra dre dri dro dru dry dst dua dub due " +
	"dug dul dum dun duo dup dur dus dut dye dyn dys dzi ear eas eat ecc ech ecl eco ect eds edu een " +
	"eer eff egg ego egy eig ein eks ela ele elf elk ell els emb emp enc end enf eng enh enn ens ent " +
	"env eps equ era ere erf erg erh erk erm ern err ers eru erv erw ery esa esc ese esk eso esp ess " +
	"est eta etc eth ett eux eve exc exh exp ext eye fab fac fal fam fan far fas fat fav fax faz fed " +
	"fee fel fem fen fer fet feu few fib fic fid fif fig fil fim fin fir fis fit fix fiz fle flo flu " +
	"fly fmt foc fod foe fog foi fol fon foo for fos fot fou fox fps fra fre fri fro fry fue fug ful " +
	"fun fur fus fut gab gad gag gal gam gan gap gar gas gay gaz gcd gdy geb ged gee gef geg geh gek " +
	"gel gem gen geo gep ger ges get gev gew gez gia gib gig gin gir git gle gli glm glo glu gly god " +
	"gol gon gor got gou gov gra gre gri gro gul gum gun gut guy gym hab hac had hai hak hal ham han " +
	"har has hat hav hay haz heb hed heg hel hem hen her hes het hex hey hic hid hij hil him hin hip " +
	"his hit hob hoc hod hoe hog hol hom hon hop hor hos hot how hoy hrs htt hub hud hue hug huh hum " +
	"hun hur hus hut hym hyp ice ich ici icy ide idi ids idx iff ign ihm ihn ihr iii ile ili ill ils " +
	"imb img imm imp inc ind ine inf ing inh ini inj ink inn inp ins int inv iod ion ios ips ire isn " +
	"iso iss ist ith its itu jab jag jak jal jam jan jap jar jav jaw jed jeg jej jel jer jet jeu jew " +
	"jim job jog jon jos jot jou jov joy jub jud jue jug jul jun jur jus jwt kab kad kak kal kam kan " +
	"kao kap kar kas kat kay ked kel kem ken kep ker kes ket key khi kho kid kil kim kin kir kit kle " +
	"kne kob kod kok kol kom kon kop kor kos kot kra kre ksi kul kun kup kur kut lab lac lad lag lah " +
	"lak lam lan lap lar las lat lav law lax lay laz lbl lbs ldc led leg lei lem len ler les let lev " +
	"lex ley lhs lia lib lic lid lie lif lig lij lik lil lim lin lip lis lit liv lle lob loc lod log " +
	"loi lok lol lon lor los lot lou lov low lst lub luc lud lug lui luk lum lun lup lur lut lux luz " +
	"lyn lys mac mad mag mah mai maj mak mal mam man map mar mas mat mau max may mdl mec med mee meg " +
	"mej mel mem men mer mes met meu mex mez mga mia mic mid mie mig mij mik mil mim min mio mir mis " +
	"mit mix mob moc mod mog moi mol mom mon mor mos mot mou mov moy mph msg muc mud mug muj mul mum " +
	"mun mur mus mut muy mys nab nad nag nah naj nak nal nam nan nap nar nas nat nau nav naw naz neb " +
	"nec ned neg nei nel nem nen neo nep ner net neu new nex nga ngh nib nic nie nig nik nil nim nin " +
	"nip nit nob noc nod nog noi nom non nor nos not nou nov now npm nth nud nue nug num nun nur nut " +
	"nya oak oat obj obl obs obt occ och oct odd ode odp off oft ogs oil old ole oli omn onc one ons " +
	"ont ook opp ops opt ora orb ord ore org oro ort osc osp oss ost ott oud our out owe owl own pac " +
	"pad pag pai paj pak pal pam pan pap par pas pat pau pav paw pay paz pdf pea pec ped pee peg pel " +
	"pem pen pep per pes pet peu pew phi php pic pid pie pig pik pil pin pip pir pis pit piv pix pla " +
	"plc ple plt ply pob poc pod pog poi poj pok pol pom pon pop por pos pot pou pov pow poz ppm ppt " +
	"pra pre pri pro prv pry prz psi psy ptr pts pub pud pul pun pup pur pus put pyl pyt qua que qui " +
	"quo rac rad rag raj rak ram ran rap ras rat rav raw ray raz reb rec red ref reg rek rel rem ren " +
	"rep req rer res ret rev rew rez rgb rhe rhs rib ric rid rif rig rij rim rin rip ris rit riv rob " +
	"rod roi rol rom ros rot rou row roy roz rpm rst rub rud rue rug rum run rus rut sab sac sad saf " +
	"sag sai sak sal sam san sap sar sat sau sav saw sax say sce sch sci sco scr sea sec sed see seg " +
	"sei sek sel sem sen sep seq ser ses set seu sew sex sha she sho shr shy sia sic sid sie sig sik " +
	"sil sim sin sip sir sis sit six ske ski sky sla sle smo sne sno sob soc sod sof sog sok sol som " +
	"son sop sor sos sou sow soy spa spe sph spi spl spo spp spr spy sql squ src ssh sta std ste sto " +
	"str stu sty sua sub suc sud sue suf sug sui suk sul sum sun suo sup sur sus sut swe swo sym syn " +
	"sys tab tac tad tag tah tai tak tal tam tan tap tar tas tat tau tav tax tbl tea ted tee teg teh " +
	"tej tek tel tem ten tep ter tes tet tex tha the thi tho thr thu thy tid tie tik til tim tin tip " +
	"tir tit tmp tob toc tod toe tog tok tol tom ton too top tor tot tou tow tox toy tra tre tri tro " +
	"try tsp tua tub tud tug tul tum tun tuo tur tus tut tuy twe two txt tym typ tyr tys ucz uid uit " +
	"ull ult uma ump una unb unc und une unf ung unh uni unl unm unn uno unp unr uns unt unw upd upp " +
	"ups upt urb ure urg uri url urn usa use uso ust usu utf uur vac vad vag vai vak val van vap var " +
	"vas vec ved veg vel vem ven ver ves vet vex vez via vib vic vid vie vig vil vin vip vir vis vit " +
	"viv viz voc voi vol vom von vor vos vot vou vow vox voy voz vra vue vul wag wah wal wan war was " +
	"wat wax way web wed wee weg wel wen wer wes wet whe who why wid wie wig wij wik wil win wir wis " +
	"wit wol won woo wor wow wre wsp wsz wur www wym wyn wys xen xml xor xxx yak yen yer yes yet yii " +
	"yog yol you yrs zab zad zag zaj zak zal zam zap zar zaw zen zer zie zig zij zip zoo zou zug zum " +
	"zur zwe "
